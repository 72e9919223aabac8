"""What to keep of a prompt over its budget or turn limit (docs/architecture.md §6), and
the proof that it fits for a counter whose per-message split is not additive."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from proxy.errors import ContextLengthExceeded, context_length_exceeded
from proxy.settings import Settings
from proxy.trimming import TrimPolicy, TrimResult, least_kept, trim
from proxy.types import Message, PromptCount, PromptLimit

# Rounds of recount-and-tighten before giving up on a non-additive counter.
_RECOUNTS = 4


def trim_to(
    settings: Settings,
    messages: Sequence[Message],
    count: PromptCount,
    limit: PromptLimit | None,
    history_start: int,
) -> tuple[TrimPolicy, TrimResult]:
    """What to keep of a prompt over its budget or turn limit, under the settings'
    policy; a counter that is not additive proves it next (``prove_fits``)."""
    policy = TrimPolicy(
        budget=None if limit is None else limit.budget,
        target=settings.trim_target,
        max_history_turns=settings.max_history_turns,
        pin_first_user=settings.pin_first_user,
        limit=limit,
    )
    return policy, trim(messages, count, policy, history_start=history_start)


#: The count of the kept messages (or items) of a request, as the engine renders them.
Recount = Callable[[Sequence[int]], Awaitable[int]]


async def prove_fits(
    messages: Sequence[Message],
    recount: Recount,
    count: PromptCount,
    policy: TrimPolicy,
    history_start: int,
    result: TrimResult,
) -> TrimResult:
    """Prove that ``result`` (``trim`` of ``messages`` under ``policy``) fits: returns
    the result to forward, its ``tokens`` the recount.

    A counter whose per-message split is not additive for every subset (the chat
    template renders a message differently by position) gets the kept list recounted;
    when that is over the budget, the budget is tightened by the excess and trimmed
    again, so the budget is a guarantee, not an estimate. When that does not settle
    (or the tightened budget is below even the least the request keeps), the least
    itself, the system block and the last turn, is recounted: forwarded when it fits,
    else the refusal names its real count. An additive counter's sums are the count
    itself: the chat route awaits this only for the others.
    """
    if len(result.kept) == len(messages) or policy.budget is None:
        return result
    budget = policy.budget
    tightened = policy
    for _ in range(_RECOUNTS):
        actual = await recount(result.kept)
        if actual <= budget:
            return replace(result, tokens=actual)
        excess = actual - result.tokens
        tightened = replace(tightened, budget=(tightened.budget or budget) - excess)
        try:
            result = trim(messages, count, tightened, history_start=history_start)
        except ContextLengthExceeded:
            break
    least = least_kept(messages)
    actual = await recount(least)
    if actual <= budget:
        return TrimResult(least, actual, "budget")
    raise context_length_exceeded(actual, policy.limit or PromptLimit(budget))
