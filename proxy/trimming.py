"""Pure trimming: which messages of a chat request to keep under a token budget.

No I/O and no state: the input is the messages, their counts and a policy; the
output is the indices to keep. The invariants of docs/architecture.md §6 hold for every
input, and each one has a property test.

A *turn* is a user message with every message after it up to the next user
message, so an assistant ``tool_calls`` message and its ``tool`` results always
fall in the same turn and are kept or dropped together. Messages between the
leading system block and the first user message form a turn of their own that can
only be dropped (the kept history must start with a user message).

Prefix stability: cutting the oldest turn on every request changes the prompt
prefix every time and defeats the upstream's prefix cache. So a cut goes down to
``target`` x budget, and the cut point then holds while the conversation grows
back to the budget. The cut point is derived by replaying the conversation's
growth turn by turn with the same rule, so it needs no stored state and every
replica computes the same answer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

from proxy.errors import context_length_exceeded
from proxy.types import Message, PromptCount, PromptLimit

HEAD_ROLES = frozenset(("system", "developer"))


# Not frozen: read-only by convention (why: proxy.types, above PromptCount). Keyword
# arguments only: four of its five fields are a number or a flag, easy to swap unseen.
@dataclass(slots=True, kw_only=True)
class TrimPolicy:
    budget: int | None
    """The most prompt tokens to keep; None for no budget (only a turn limit cuts)."""
    target: float = 0.6
    """The low-water mark a cut goes down to, a fraction of the budget."""
    max_history_turns: int | None = None
    pin_first_user: bool = False
    """Keep the first user turn while it fits (a preference, never a must)."""
    limit: PromptLimit | None = None
    """Where the budget comes from, for the refusal's wording; None words it as a bare
    budget. Its own ``budget`` may be above this policy's: a recount tightens the
    policy and the refusal still names the client's limit."""


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class TrimResult:
    kept: tuple[int, ...]
    """Indices into the input messages, ascending."""
    tokens: int
    """Counted prompt of the kept messages (per-message sums plus overhead)."""
    reason: str | None
    """``"budget"``, ``"max_turns"``, ``"session"`` or None when nothing was dropped."""

    def dropped(self, total_messages: int) -> int:
        return total_messages - len(self.kept)


@dataclass(frozen=True, slots=True)
class Turns:
    head: int
    """Messages ``[0, head)`` are the leading system/developer block."""
    starts: tuple[int, ...]
    """Start index of each turn; turn i spans ``[starts[i], starts[i+1])``."""
    first_is_user: bool
    """False when the first turn is the non-user run after the head."""


def split_turns(messages: Sequence[Message]) -> Turns:
    head, starts, first_is_user = _turns(messages)
    return Turns(head, tuple(starts), first_is_user)


def head_length(messages: Sequence[Message]) -> int:
    """How many messages the leading system/developer block holds."""
    n = len(messages)
    head = 0
    while head < n and messages[head].get("role") in HEAD_ROLES:
        head += 1
    return head


def least_kept(messages: Sequence[Message]) -> tuple[int, ...]:
    """What trimming keeps at the least: the leading system/developer block and the
    last turn (what ``trim``'s refusal counts)."""
    head, starts, _ = _turns(messages)
    tail = starts[-1] if starts else len(messages)
    return (*range(head), *range(tail, len(messages)))


def _turns(messages: Sequence[Message]) -> tuple[int, list[int], bool]:
    """The one definition of a turn: the head's length, where each turn opens, and
    whether the first turn is a user turn.

    The message at the head opens the first turn whatever its role (a leading non-user
    turn when it is not a user message); every later user message opens one.
    """
    n = len(messages)
    head = head_length(messages)
    if head == n:
        return head, [], True
    starts = [i for i in range(head, n) if messages[i].get("role") == "user"]
    if starts and starts[0] == head:
        return head, starts, True
    starts.insert(0, head)
    return head, starts, False


def _turn_sums(acc: list[int], starts: list[int]) -> list[int]:
    """Each turn's summed count, from the prefix sums ``acc`` of the per-message counts."""
    return [acc[b] - acc[a] for a, b in pairwise((*starts, len(acc) - 1))]


def _openings(
    acc: list[int], per: Sequence[int], starts: list[int], first_is_user: bool
) -> list[int]:
    """What each turn weighed when it was the newest, i.e. in the request that ended
    with its user message: the user message, but the whole of a leading non-user turn
    (one request's worth: it is all there was before the first user message)."""
    openings = [per[s] for s in starts]
    if openings and not first_is_user:
        end = starts[1] if len(starts) > 1 else len(acc) - 1
        openings[0] = acc[end] - acc[starts[0]]
    return openings


def fits_whole(
    total: int, budget: int | None, max_history_turns: int | None, history_start: int = 0
) -> bool:
    """Whether ``trim`` keeps every message, known without looking at them: the common
    case, which the chat route checks before it builds a policy.

    Prompts only grow along the replay, so when the whole conversation fits, no step
    of it was ever over the budget: nothing to cut. (A turn limit or a session's reset
    point may still cut, so either one sends the request the long way.)
    """
    return history_start == 0 and max_history_turns is None and (budget is None or total <= budget)


def trim(
    messages: Sequence[Message],
    count: PromptCount,
    policy: TrimPolicy,
    *,
    history_start: int = 0,
) -> TrimResult:
    """Choose the messages to forward.

    ``history_start`` is a session's reset point: turns that begin before it are
    dropped whatever the budget (docs/architecture.md §10); it is an index into
    ``messages`` and snaps forward to the next turn start.
    Raises ``ContextLengthExceeded`` when the system block plus the last turn alone
    are over the budget, with that figure: the least the request needs. A pinned
    first turn is not part of it; a pin is dropped when it is what does not fit.
    """
    n = len(messages)
    if fits_whole(count.total, policy.budget, policy.max_history_turns, history_start):
        return TrimResult(tuple(range(n)), count.total, None)
    per = count.per_message
    head, starts, first_is_user = _turns(messages)
    # acc[i]: the tokens of messages [0, i). Every sum below is a difference of two.
    acc = list(accumulate(per, initial=0))
    fixed = count.overhead + acc[head]
    if policy.budget is not None:
        least = fixed + acc[-1] - (acc[starts[-1]] if starts else acc[-1])
        if least > policy.budget:
            raise context_length_exceeded(least, policy.limit or PromptLimit(policy.budget))
    first_droppable, pinned, reason = _droppable(starts, first_is_user, policy, history_start)
    cut_reason, first_kept, tokens = _choose(
        acc, per, starts, first_is_user, fixed, first_droppable, pinned, policy
    )
    if pinned is not None and policy.budget is not None and tokens > policy.budget:
        # The pin is a preference; only the system block and the last turn are musts,
        # and they fit (``least``): without the pin the replay keeps at most them.
        pinned = None
        cut_reason, first_kept, tokens = _choose(
            acc, per, starts, first_is_user, fixed, first_droppable, None, policy
        )
    reason = cut_reason or reason
    # The kept turns run from first_kept to the end, with the pin before them when
    # there is one: the head, at most one turn on its own, one run to the end.
    tail = starts[first_kept] if first_kept < len(starts) else n
    if pinned is not None and pinned < first_kept:
        end = starts[pinned + 1] if pinned + 1 < len(starts) else n
        kept = (*range(head), *range(starts[pinned], end), *range(tail, n))
    else:
        kept = (*range(head), *range(tail, n))
    if len(kept) == n:
        reason = None
    return TrimResult(kept, tokens, reason)


def _droppable(
    starts: Sequence[int], first_is_user: bool, policy: TrimPolicy, history_start: int
) -> tuple[int, int | None, str | None]:
    """The first turn the replay may drop, the pinned turn, and ``session`` when a
    session's reset point drops turns whatever the budget.

    Turns the replay may drop, oldest first: [first_droppable, len(starts)). The last
    turn is never dropped (the replay stops at it); a leading non-user turn goes with
    the first cut, so the kept history always starts with a user message once
    anything was dropped.
    """
    first_droppable = 0
    reason: str | None = None
    pinned: int | None = None
    if policy.pin_first_user:
        first_user = 0 if first_is_user else 1
        if first_user < len(starts) - 1:
            pinned = first_user
    if history_start > 0 and starts:
        reset_turn = next((i for i, s in enumerate(starts) if s >= history_start), len(starts) - 1)
        if reset_turn > 0:
            first_droppable = reset_turn
            reason = "session"
            if pinned is not None and pinned < reset_turn:
                pinned = None  # a reset drops the whole earlier history, pins included
    return first_droppable, pinned, reason


def _choose(
    acc: list[int],
    per: Sequence[int],
    starts: list[int],
    first_is_user: bool,
    fixed: int,
    first: int,
    pinned: int | None,
    policy: TrimPolicy,
) -> tuple[str | None, int, int]:
    """The reason for the cut (if any), the first turn of the kept run and the tokens
    kept.

    The turns ``[first, len(starts))`` but ``pinned`` may be dropped; the kept ones are
    the pin (always kept) and every turn from the returned one to the end.

    Each step of the replay adds one turn's opening (``_openings``), so every earlier
    step repeats exactly the decision that earlier request made; the last step's turn
    is whole.
    """
    total = acc[-1]
    if pinned is None:
        # The droppable turns run to the end: their prefix sums are acc's own, and a
        # step's prompt runs to the end of its turn's opening message, acc[s + 1].
        turns = starts[first:]
        if not turns:
            return None, first, fixed
        prefix = [acc[s] for s in turns]
        prefix.append(total)
        prompts = [acc[s + 1] for s in turns]
        prompts[-1] = total
        if first == 0 and not first_is_user:  # a leading non-user turn opens whole
            prompts[0] = prefix[1]
        cut, reason = _replay(prefix, prompts, fixed, policy)
        return reason, first + cut, fixed + total - prefix[cut]
    sizes = _turn_sums(acc, starts)
    droppable = [t for t in range(first, len(sizes)) if t != pinned]
    fixed += sizes[pinned]
    seq = [sizes[t] for t in droppable]
    if not seq:  # only the pin is left to keep (trim never pins the last turn)
        return None, len(starts), fixed
    prefix = [0, *accumulate(seq)]
    openings = _openings(acc, per, starts, first_is_user)
    prompts = [before + openings[t] for before, t in zip(prefix, droppable, strict=False)]
    prompts[-1] = prefix[-1]
    cut, reason = _replay(prefix, prompts, fixed, policy)
    # The last turn is never dropped (cut < len(droppable)), so this is a turn index.
    return reason, droppable[cut], fixed + prefix[-1] - prefix[cut]


def _replay(
    prefix: Sequence[int], prompts: Sequence[int], fixed: int, policy: TrimPolicy
) -> tuple[int, str | None]:
    """Replay the conversation's growth turn by turn and return the cut point.

    Step k is the request that ended with turn k's user message: turns ``[cut, k)``
    whole plus turn k's opening, ``prompts[k] - prefix[cut]``; the last step is this
    request, its last turn whole. ``prefix[k]`` is the running total before turn k,
    and ``prompts[k]`` step k's prompt, from the same origin (only differences are
    read); ``prefix`` has one entry more than there are steps.
    When a step is over the budget (or over ``max_history_turns``), the cut moves
    forward until the prompt is at or under the low-water mark (``target`` x the
    limit); if that is impossible, as far as the limit itself allows, and at worst
    to k. The cut never moves back, so between cuts every prompt extends the
    previous one.
    """
    budget = policy.budget
    max_turns = policy.max_history_turns
    if max_turns is None:
        if budget is None:
            return 0, None
        low_water = max(0, int(budget * policy.target)) - fixed
        return _replay_budget(prefix, prompts, budget - fixed, low_water)
    low = None if budget is None else max(0, int(budget * policy.target)) - fixed
    high = None if budget is None else budget - fixed
    low_turns = max(1, int(max_turns * policy.target))
    cut = 0
    base = prefix[0]  # prefix[cut]
    reason: str | None = None
    for k, prompt in enumerate(prompts):
        if high is not None and prompt - base > high:
            assert low is not None
            cut, reason = _cut_to(prefix, cut, k, prompt, low, high), "budget"
            base = prefix[cut]
        if k + 1 - cut > max_turns:
            cut, reason = k + 1 - low_turns, "max_turns"
            base = prefix[cut]
    return cut, reason


def _replay_budget(
    prefix: Sequence[int], prompts: Sequence[int], high: int, low: int
) -> tuple[int, str | None]:
    """``_replay`` with a budget and no turn limit, the common policy: the same steps,
    visited only where one is over the budget.

    While the cut holds, a step's prompt is never smaller than the one before (a turn
    weighs at least its opening, and counts are never negative), so the next step
    over the budget is a bisection of the prompts, as is each cut (``_cut_to``).
    """
    steps = len(prompts)
    cut = 0
    reason: str | None = None
    k = bisect_right(prompts, high + prefix[0])
    while k < steps:
        cut, reason = _cut_to(prefix, cut, k, prompts[k], low, high), "budget"
        k = bisect_right(prompts, high + prefix[cut], k + 1)
    return cut, reason


def _cut_to(prefix: Sequence[int], cut: int, k: int, prompt: int, low: int, high: int) -> int:
    """The new cut when step k (``prompt``: its prefix plus its newest part) is over the
    budget: forward to the low-water mark, else as far as the budget itself needs, at
    worst to k. ``prefix`` never falls, so the first cut that gets under a mark is a
    bisection."""
    c = bisect_left(prefix, prompt - low, cut, k)
    if prompt - prefix[c] > low:
        c = bisect_left(prefix, prompt - high, cut, k)
    return c
