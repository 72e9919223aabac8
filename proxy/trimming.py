"""Pure trimming: which messages of a chat request to keep under a token budget.

No I/O and no state: the input is the messages, their counts and a policy; the
output is the indices to keep. The invariants of DESIGN section 3 hold for every
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

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from proxy.errors import ContextLengthExceeded
from proxy.types import Message, PromptCount

HEAD_ROLES = frozenset(("system", "developer"))


@dataclass(frozen=True, slots=True)
class TrimPolicy:
    budget: int | None
    target: float = 0.6
    max_history_turns: int | None = None
    pin_first_user: bool = False


@dataclass(frozen=True, slots=True)
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
    head, starts, _, first_is_user = turn_sizes(messages, [0] * len(messages))
    return Turns(head, tuple(starts), first_is_user)


def head_length(messages: Sequence[Message]) -> int:
    """How many messages the leading system/developer block holds."""
    n = len(messages)
    head = 0
    while head < n and messages[head].get("role") in HEAD_ROLES:
        head += 1
    return head


def turn_sizes(
    messages: Sequence[Message], per: Sequence[int]
) -> tuple[int, list[int], list[int], bool]:
    """``split_turns`` in one pass, with each turn's summed count: head, starts, sizes
    and first_is_user, without building a ``Turns`` (trimming runs it per request)."""
    n = len(messages)
    head = head_length(messages)
    if head == n:
        return head, [], [], True
    # The message at head opens the first turn whatever its role (a leading non-user
    # turn when it is not a user message); every later user message opens one.
    starts = [head]
    sizes: list[int] = []
    size = 0
    for i in range(head, n):
        if i != head and messages[i].get("role") == "user":
            starts.append(i)
            sizes.append(size)
            size = 0
        size += per[i]
    sizes.append(size)
    return head, starts, sizes, messages[head].get("role") == "user"


def trim(
    messages: Sequence[Message],
    count: PromptCount,
    policy: TrimPolicy,
    *,
    history_start: int = 0,
) -> TrimResult:
    """Choose the messages to forward.

    ``history_start`` is a session's reset point: turns that begin before it are
    dropped whatever the budget (DESIGN section 4); it is an index into
    ``messages`` and snaps forward to the next turn start.
    Raises ``ContextLengthExceeded`` when the system block plus the last turn alone
    are over the budget.
    """
    n = len(messages)
    if (
        history_start == 0
        and policy.max_history_turns is None
        and (policy.budget is None or count.total <= policy.budget)
    ):
        # The common case. Prompts only grow along the replay, so when the whole
        # conversation fits, no step of it was ever over the budget: nothing to cut.
        return TrimResult(tuple(range(n)), count.total, None)
    per = count.per_message
    head, starts, sizes, first_is_user = turn_sizes(messages, per)
    fixed = count.overhead + sum(per[:head])
    reason: str | None = None

    # Turns the replay may drop, oldest first: [first_droppable, len(starts)). The
    # last turn is never dropped (the replay stops at it); a leading non-user turn
    # goes with the first cut, so the kept history always starts with a user message
    # once anything was dropped.
    first_droppable = 0
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
    # What each turn weighed when it was the newest, i.e. in the request that ended
    # with its user message: replaying with those weights makes every earlier step
    # repeat exactly the decision that earlier request made.
    # Every turn opens with its user message but a leading non-user turn (one
    # request's worth: it is all there was before the first user message).
    openings = [per[s] for s in starts]
    if not first_is_user:
        openings[0] = sizes[0]
    cut_reason, kept_turns, tokens = _choose(
        sizes, openings, fixed, first_droppable, pinned, policy
    )
    if pinned is not None and policy.budget is not None and tokens > policy.budget:
        # The pin is a preference; only the system block and the last turn are musts.
        cut_reason, kept_turns, tokens = _choose(
            sizes, openings, fixed, first_droppable, None, policy
        )
    reason = cut_reason or reason
    if policy.budget is not None and tokens > policy.budget:
        raise ContextLengthExceeded(
            f"This conversation needs {tokens} prompt tokens even after dropping every "
            f"earlier turn (system messages plus the last user turn), but the budget is "
            f"{policy.budget} tokens. Shorten the last message or the system prompt, "
            f"or lower max_tokens.",
            param="messages",
        )
    if isinstance(kept_turns, int):  # the turns from kept_turns on: one run of messages
        kept = (*range(head), *range(starts[kept_turns] if starts else n, n))
    else:
        bounds = (*starts, n)
        runs = [range(head)]
        runs.extend(range(bounds[t], bounds[t + 1]) for t in kept_turns)
        kept = tuple(i for run in runs for i in run)
    if len(kept) == n:
        reason = None
    return TrimResult(kept, tokens, reason)


def _choose(
    sizes: list[int],
    openings: list[int],
    fixed: int,
    first: int,
    pinned: int | None,
    policy: TrimPolicy,
) -> tuple[str | None, int | list[int], int]:
    """The reason for the cut (if any), the kept turns and their tokens.

    The turns ``[first, len(sizes))`` but ``pinned`` may be dropped. The kept turns
    are the index of the first one kept when they run to the end without a gap (no
    pin), else their list.
    """
    if pinned is None:
        seq = sizes[first:]
        cut, reason = _replay(seq, openings[first:], fixed, policy)
        return reason, first + cut, fixed + sum(seq[cut:])
    droppable = [t for t in range(first, len(sizes)) if t != pinned]
    fixed += sizes[pinned]
    seq = [sizes[t] for t in droppable]
    cut, reason = _replay(seq, [openings[t] for t in droppable], fixed, policy)
    return reason, sorted([pinned, *droppable[cut:]]), fixed + sum(seq[cut:])


def _replay(
    sizes: Sequence[int], openings: Sequence[int], fixed: int, policy: TrimPolicy
) -> tuple[int, str | None]:
    """Replay the conversation's growth turn by turn and return the cut point.

    Step k is the request that ended with turn k's user message: turns ``[cut, k)``
    whole plus turn k's opening; the last step is this request, its last turn whole.
    When a step is over the budget (or over ``max_history_turns``), the cut moves
    forward until the prompt is at or under the low-water mark (``target`` x the
    limit); if that is impossible, as far as the limit itself allows, and at worst
    to k. The cut never moves back, so between cuts every prompt extends the
    previous one.
    """
    n = len(sizes)
    if n == 0:
        return 0, None
    prefix = [0, *accumulate(sizes)]
    # Step k's newest part: turn k's opening, but the last step's last turn is whole.
    newest_at = [*openings[:-1], sizes[-1]]
    budget = policy.budget
    low = None if budget is None else max(0, int(budget * policy.target)) - fixed
    high = None if budget is None else budget - fixed
    max_turns = policy.max_history_turns
    low_turns = None if max_turns is None else max(1, int(max_turns * policy.target))
    cut = 0
    base = 0  # prefix[cut]
    reason: str | None = None
    # prefix has one entry more than there are steps: the total, never a step's start.
    for k, (before, newest) in enumerate(zip(prefix, newest_at, strict=False)):
        if high is not None and before - base + newest > high:
            # Over the budget: advance to the low-water mark, else the high one.
            assert low is not None
            c = cut
            while c < k and before - prefix[c] + newest > low:
                c += 1
            if before - prefix[c] + newest > low:
                c = cut
                while c < k and before - prefix[c] + newest > high:
                    c += 1
            cut, reason = c, "budget"
            base = prefix[cut]
        if max_turns is not None and k + 1 - cut > max_turns:
            assert low_turns is not None
            cut, reason = k + 1 - low_turns, "max_turns"
            base = prefix[cut]
    return cut, reason
