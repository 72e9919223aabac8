"""The trim ladder on the request path (docs/architecture.md §6, the trim ladder): the
glue between the prepare steps and the pure ``proxy.ladder``.

A prompt over its budget that holds tool outputs climbs the ladder here, under
``TRIMPROXY_CLEAR_TOOL_OUTPUTS=auto``; every other prompt goes ``proxy.trimming``'s
way as before (the callers' own path: these functions answer None). Each output is
counted cleared once (only the placeholders are new text: every other item keeps the
count it had), and a counter that is not additive gets the forwarded form recounted,
the budget tightened by any excess, as ``proxy.pipeline.prepare.prove_fits`` does for turns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.dependencies import Services
from proxy.dialects.conversation import Conversation
from proxy.dialects.tool_outputs import ToolOutputs
from proxy.errors import ContextLengthExceeded, context_length_exceeded
from proxy.ladder import CLEARED, Climb, Survey, climb, placeholder, survey, with_cleared
from proxy.logs import RequestFacts
from proxy.metrics import ModelSeries
from proxy.trimming import TrimPolicy, TrimResult
from proxy.types import JSONObject, Message, PromptCount, PromptLimit

#: Response header: how many tool outputs the trim ladder cleared.
CLEARED_TOOL_OUTPUTS = "x-trimproxy-cleared-tool-outputs"
# Rounds of recount-and-tighten before giving up on a non-additive counter.
_RECOUNTS = 4

#: The count of what ``Climb`` forwards, as the engine renders it.
Recount = Callable[[Climb], Awaitable[int]]


def _policy(svc: Services, limit: PromptLimit) -> TrimPolicy:
    settings = svc.settings
    return TrimPolicy(
        budget=limit.budget,
        target=settings.trim_target,
        max_history_turns=settings.max_history_turns,
        pin_first_user=settings.pin_first_user,
        limit=limit,
    )


async def _proved(
    svc: Services,
    roles: Sequence[Message],
    count: PromptCount,
    outputs: Sequence[int],
    cleared: Sequence[int],
    policy: TrimPolicy,
    history_start: int,
    recount: Recount,
    surveyed: Survey | None,
) -> Climb:
    """The ladder's answer, recounted when the counter is not additive: over the
    budget, the budget is tightened by the excess and the ladder climbed again."""
    keep = svc.settings.keep_tool_outputs

    def under(p: TrimPolicy) -> Climb:
        return climb(
            roles,
            count,
            outputs,
            cleared,
            p,
            keep=keep,
            history_start=history_start,
            surveyed=surveyed,
        )

    climbed = under(policy)
    if svc.counter.additive:
        return climbed
    budget = policy.budget
    assert budget is not None
    tightened = policy
    actual = climbed.tokens
    for _ in range(_RECOUNTS):
        actual = await recount(climbed)
        if actual <= budget:
            climbed.tokens = actual
            return climbed
        excess = actual - climbed.tokens
        tightened = replace(tightened, budget=(tightened.budget or budget) - excess)
        try:
            climbed = under(tightened)
        except ContextLengthExceeded:
            break
    raise context_length_exceeded(actual, policy.limit or PromptLimit(budget))


def _note(
    climbed: Climb,
    total: int,
    received: int,
    metrics: ModelSeries,
    out: dict[str, str],
    facts: RequestFacts,
) -> int:
    """The ladder's facts in the metrics, the header and the access line: the
    messages (or items) dropped."""
    dropped = climbed.dropped(total)
    if dropped:
        metrics.trimmed(dropped, max(0, received - climbed.tokens), _reason(climbed))
    if climbed.cleared:
        metrics.cleared(len(climbed.cleared), climbed.cleared_tokens)
    out[CLEARED_TOOL_OUTPUTS] = str(len(climbed.cleared))
    facts.tool_outputs_cleared = len(climbed.cleared)
    return dropped


async def cleared_counts(
    svc: Services,
    kind: ToolOutputs,
    items: Sequence[Any],
    outputs: Sequence[int],
    per: Sequence[int],
    model: str | None,
) -> list[int]:
    """Each output's count once cleared: its count less what its content weighs, plus
    what the placeholder weighs, both counted as the content of a bare message (the
    framing cancels out). The contents are the client's own strings, counted on every
    request of the conversation: a counter's cache has them, and only the placeholders
    are new (docs/architecture.md §6)."""
    key = kind.field
    if key is None:
        texts: list[Message] = [
            {"role": "tool", "content": _text(kind.content(items[i]))} for i in outputs
        ]
        texts += [
            {"role": "tool", "content": _text(kind.cleared(items[i], per[i]))} for i in outputs
        ]
        counted = (await svc.counter.count(texts, model=model)).per_message
        n = len(outputs)
        return [per[i] - c + p for i, c, p in zip(outputs, counted, counted[n:], strict=False)]
    # A placeholder's count depends on its number's digits alone (every counter here
    # counts a run of digits by its length): one count a length, not one an output.
    held = [per[i] for i in outputs]
    shortest, longest = len(str(min(held))), len(str(max(held)))
    # One loop an output, reading its text in place: a request that needs clearing
    # counts every output of an agent's task (docs/performance.md §6).
    texts = [
        {"role": "tool", "content": c if (c := items[i].get(key)).__class__ is str else _text(c)}
        for i in outputs
    ]
    texts += [
        {"role": "tool", "content": placeholder(10 ** (d - 1))}
        for d in range(shortest, longest + 1)
    ]
    counted = (await svc.counter.count(texts, model=model)).per_message
    n = len(outputs)
    if shortest == longest:
        blank = counted[n]
        return [h - c + blank for h, c in zip(held, counted, strict=False)]
    at = n - shortest  # counted[at + d]: the placeholder of d digits
    return [h - c + counted[at + len(str(h))] for h, c in zip(held, counted, strict=False)]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _reason(climbed: Climb) -> str:
    """Why items were dropped: ``proxy.trimming``'s reason (a budget, a turn limit, a
    session's reset)."""
    reason = climbed.reason
    return reason if reason is not None and reason != CLEARED else "budget"


def may_clear(svc: Services, kind: ToolOutputs | None, conv: Conversation) -> bool:
    """Whether the ladder may have outputs to clear: it is on, and the dialect has tool
    outputs, chat's told by its parse. Most prompts over a budget hold none, and this
    spares them the survey's pass and the ladder's coroutine (docs/performance.md §6)."""
    if kind is None or svc.settings.clear_tool_outputs != "auto":
        return False
    if not kind.in_roles:
        return True
    told = conv.holds_tool_role
    if told is not None:
        return told
    return any(role["role"] == "tool" for role in conv.roles)


async def conversation_ladder(
    svc: Services,
    w: Any,
    conv: Conversation,
    count: PromptCount,
    limit: PromptLimit | None,
    history_start: int,
    metrics: ModelSeries,
    out: dict[str, str],
    facts: RequestFacts,
) -> tuple[TrimResult, Conversation] | None:
    """A dialect's prompt over its budget through the ladder (``w``: the dialect's
    ``proxy.pipeline.dialect.Dialect``): the kept items and the conversation to render
    them from, the cleared outputs in place; None when the ladder is off or the
    prompt holds no tool output."""
    kind: ToolOutputs | None = w.tool_outputs
    if limit is None or kind is None:  # the caller asked ``may_clear`` first
        return None
    surveyed = survey(conv.roles) if kind.in_roles else None
    outputs = kind.find(conv.items) if surveyed is None else surveyed.tools
    if not outputs:
        return None
    per = count.per_message
    cleared = await cleared_counts(svc, kind, conv.items, outputs, per, conv.model)

    def rendered(climbed: Climb) -> Conversation:
        return replace(conv, items=with_cleared(conv.items, climbed.cleared, kind.clear, per))

    async def recount(climbed: Climb) -> int:
        shown = rendered(climbed)
        chat_messages, _ = w.to_chat(shown, climbed.kept)
        tools: list[JSONObject] | None = w.tools(shown, climbed.kept)
        return (await svc.counter.count(chat_messages, tools=tools, model=conv.model)).total

    policy = _policy(svc, limit)
    climbed = await _proved(
        svc, conv.roles, count, outputs, cleared, policy, history_start, recount, surveyed
    )
    dropped = _note(climbed, len(conv.items), count.total, metrics, out, facts)
    result = TrimResult(climbed.kept, climbed.tokens, _reason(climbed) if dropped else None)
    return result, (rendered(climbed) if climbed.cleared else conv)
