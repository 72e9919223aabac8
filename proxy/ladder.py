"""The trim ladder (docs/architecture.md §6, the trim ladder): what to clear and drop of
a prompt over its budget, rung by rung, each rung only while the prompt is still over.

1. clear the content of the oldest tool outputs (every turn's), the latest ``keep``
   whole;
2. drop whole oldest turns (``proxy.trimming``, over the cleared counts);
3. inside the last turn, drop the oldest whole rounds (an assistant's calls and their
   outputs, already cleared), the user message that opened the turn kept;
4. refuse, as ``proxy.trimming`` does.

Pure: the input is the items' trim view (roles), their counts whole and cleared and a
policy; no I/O, no state. Every rung is replayed over the conversation's requests the
way ``proxy.trimming`` replays its cut over turns: a request ends where an assistant
item follows a non-assistant one (the client sent everything before it), so each
step repeats exactly the decision the request that ended there made. A step over the
budget clears (or drops) down to the low-water mark, and that holds while the task
grows back: between two clearings each forwarded prompt begins with the previous one.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from proxy.errors import ContextLengthExceeded, context_length_exceeded
from proxy.trimming import HEAD_ROLES, TrimPolicy, TrimResult, Turns, split_turns, trim
from proxy.types import Message, PromptCount, PromptLimit

#: Renders one tool output cleared: ``(item, tokens it held) -> cleared item``.
ClearOne = Callable[[object, int], object]

#: The ``reason`` of a prompt whose only change is cleared tool outputs.
CLEARED = "cleared"


def placeholder(tokens: int) -> str:
    """What a cleared tool output's content becomes: it was cleared, what it held, and
    that the tool can be called again."""
    return (
        f"[tool output cleared by trimproxy to fit the context window: it held {tokens} "
        "tokens; call the tool again if you need it]"
    )


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Climb:
    """What the ladder keeps: the items, which of them go cleared, and the count."""

    kept: tuple[int, ...]
    """Indices into the items, ascending."""
    cleared: tuple[int, ...]
    """The kept tool outputs whose content is cleared, ascending."""
    tokens: int
    """The counted prompt of the kept items, the cleared ones at their cleared count."""
    reason: str | None
    """``proxy.trimming``'s reason when items were dropped, ``cleared`` when outputs
    were only cleared, None when nothing changed."""
    cleared_tokens: int = 0
    """What the cleared outputs held beyond their placeholders."""

    def dropped(self, total: int) -> int:
        return total - len(self.kept)


# Not frozen: read-only by convention (why: proxy.types, above PromptCount).
@dataclass(slots=True)
class Survey:
    """What the ladder reads of the roles, in one pass over them: a request that needs
    clearing reads every item of an agent's task, and a pass costs about what the rest
    of its climb does (docs/performance.md §6)."""

    turns: Turns
    """``proxy.trimming.split_turns``'."""
    ends: list[int]
    """``request_ends``'."""
    tools: list[int]
    """The items of role ``tool``, ascending (chat's tool outputs)."""


def survey(roles: Sequence[Message]) -> Survey:
    """The turns, the request ends and the tool items of the items' trim view."""
    n = len(roles)
    head = 0
    while head < n and roles[head].get("role") in HEAD_ROLES:
        head += 1
    return _survey(roles, head)


def _survey(roles: Sequence[Message], head: int) -> Survey:
    n = len(roles)
    users: list[int] = []
    ends: list[int] = []
    tools: list[int] = []
    after = False  # the item before is not an assistant's (none counts before the head)
    opened = False  # the item before is a user item: a turn's opening request ended there
    for i in range(head, n):
        name = roles[i].get("role")
        if name == "assistant":
            # Before the first tool output the steps are trim's alone (a turn's opening),
            # so the ladder's replay repeats what trim forwarded before it took over.
            if after and (opened or tools):
                ends.append(i)
            after = False
        else:
            if opened:
                ends.append(i)
            after = True
            if name == "tool":
                tools.append(i)
            elif name == "user":
                users.append(i)
        opened = name == "user"
    ends.append(n)
    first_is_user = not (head < n and (not users or users[0] != head))
    if not first_is_user:
        users.insert(0, head)
    return Survey(Turns(head, tuple(users), first_is_user), ends, tools)


def request_ends(roles: Sequence[Message], head: int) -> list[int]:
    """Where each request of the conversation ended (exclusive), the last one its
    whole length: after every user item (a turn's opening, ``trim``'s steps), and from
    the first tool output on, before every assistant item that follows a non-assistant
    one."""
    return _survey(roles, head).ends


def _split(names: list[object]) -> Turns:
    """``proxy.trimming.split_turns`` of items with these roles (the survey's turns)."""
    return survey([{"role": name} for name in names]).turns


def climb(
    roles: Sequence[Message],
    count: PromptCount,
    outputs: Sequence[int],
    cleared_counts: Sequence[int],
    policy: TrimPolicy,
    *,
    keep: int = 3,
    history_start: int = 0,
    surveyed: Survey | None = None,
) -> Climb:
    """The ladder over one request. ``outputs``: the tool outputs' item indices,
    ascending; ``cleared_counts``: each one's count once cleared; ``surveyed``: the
    roles' ``survey`` when the caller has it. Raises ``ContextLengthExceeded`` when
    even rung 3 leaves it over the budget."""
    per = count.per_message
    budget = policy.budget
    if budget is None or not outputs:
        return _as_climb(trim(roles, count, policy, history_start=history_start), ())
    acc = list(accumulate(per, initial=0))
    surveyed = surveyed or survey(roles)
    turns, ends = surveyed.turns, surveyed.ends
    # Only an output its placeholder makes smaller is worth clearing.
    gains = [per[i] - c for i, c in zip(outputs, cleared_counts, strict=True)]
    if min(gains) > 0:  # every one: no list of them to build
        pos, worth = outputs, cleared_counts
    else:
        pos = [i for i, g in zip(outputs, gains, strict=True) if g > 0]
        worth = [c for c, g in zip(cleared_counts, gains, strict=True) if g > 0]
        gains = [g for g in gains if g > 0]
    saved = list(accumulate(gains, initial=0))
    common = policy.max_history_turns is None and not policy.pin_first_user and not history_start
    if common and turns.starts:
        cut, first, resume = _replay(acc, ends, turns, pos, saved, count.overhead, policy, keep)
        return _held(acc, count.overhead, turns, first, resume, pos, saved, cut, policy)
    cut = _clearing(acc, ends, pos, saved, count.overhead, policy, keep)
    cleared = pos[:cut]
    if cleared:
        after = list(per)
        for i, c in zip(cleared, worth, strict=False):
            after[i] = c
        count = PromptCount(tuple(after), count.overhead)
    try:
        result = trim(roles, count, policy, history_start=history_start)
    except ContextLengthExceeded:
        result = _inside_last_turn(roles, count, outputs, ends, policy, keep)
    kept = set(result.kept)
    kept_cleared = tuple(i for i in cleared if i in kept)
    freed = sum(per[i] - count.per_message[i] for i in kept_cleared)
    climbed = _as_climb(result, kept_cleared, freed)
    if climbed.reason is None and kept_cleared:
        climbed.reason = CLEARED
    return climbed


def _as_climb(result: TrimResult, cleared: tuple[int, ...], freed: int = 0) -> Climb:
    return Climb(result.kept, cleared, result.tokens, result.reason, freed)


def _clearing(
    acc: Sequence[int],
    ends: Sequence[int],
    pos: Sequence[int],
    saved: Sequence[int],
    overhead: int,
    policy: TrimPolicy,
    keep: int,
) -> int:
    """Rung 1's replay: how many of the clearable outputs (oldest first) go cleared.

    Step k is the request that ended at ``ends[k]``: its prompt is ``acc[end]`` less
    what the outputs cleared so far saved. Over the budget, the clearing moves forward
    to the low-water mark, else as far as it may (the latest ``keep`` outputs of that
    request stay whole); it never moves back, and steps under the budget change
    nothing, so the next step over is a bisection (prompts only grow between
    clearings).
    """
    assert policy.budget is not None
    high = policy.budget - overhead
    low = max(0, int(policy.budget * policy.target)) - overhead
    prompts = [acc[e] for e in ends]
    cut = 0
    k = bisect_right(prompts, high + saved[cut])
    while k < len(prompts):
        most = max(cut, bisect_left(pos, ends[k]) - keep)
        cut = min(bisect_left(saved, prompts[k] - low, cut, most + 1), most)
        k = bisect_right(prompts, high + saved[cut], k + 1)
    return cut


def _replay(
    acc: Sequence[int],
    ends: Sequence[int],
    turns: Turns,
    pos: Sequence[int],
    saved: Sequence[int],
    overhead: int,
    policy: TrimPolicy,
    keep: int,
) -> tuple[int, int, int]:
    """Rungs 1 to 3 replayed together over every request: how many clearable outputs
    (oldest first) go cleared, the first kept turn, and where its kept part resumes
    after its opening message (the turn's start when it is whole).

    Step k is the request that ended at ``ends[k]``. Over the budget, it clears to the
    low-water mark (the latest ``keep`` outputs whole); then it drops whole turns, then
    the last turn's oldest rounds (``_dropping``), to the mark again; then the latest
    outputs but the newest, as far as the budget needs. What is dropped counts as
    cleared. Nothing moves back, and a step under the budget changes nothing
    (docs/architecture.md §6, the replay over requests).
    """
    assert policy.budget is not None
    starts = turns.starts
    fixed = overhead + acc[turns.head]
    high = policy.budget - fixed
    low = max(0, int(policy.budget * policy.target)) - fixed
    cut = first = 0
    resume = starts[0]

    def held(t: int, f: int, c: int) -> int:  # a step's prompt less acc[e], per state
        d = bisect_left(pos, f)
        opening = acc[starts[t] + 1] - acc[starts[t]] if f > starts[t] else 0
        return opening - acc[f] - (saved[max(c, d)] - saved[d])

    prompts = [acc[e] for e in ends]
    # Prompts only grow while the state holds: the next step over is a bisection.
    k = bisect_right(prompts, high - held(first, resume, cut))
    while k < len(ends):
        e = ends[k]
        now = prompts[k] + held(first, resume, cut)
        most = max(cut, bisect_left(pos, e) - keep)
        cut = min(bisect_left(saved, saved[cut] + now - low, cut, most + 1), most)
        if prompts[k] + held(first, resume, cut) > high and (
            options := _dropping(ends, k, starts, first, resume, pos, keep)
        ):
            sizes = [prompts[k] + held(t, f, cut) for t, f in options]
            j = next((j for j, p in enumerate(sizes) if p <= low), None)
            if j is None:
                j = next((j for j, p in enumerate(sizes) if p <= high), len(options) - 1)
            first, resume = options[j]
            cut = max(cut, bisect_left(pos, resume))
        if prompts[k] + held(first, resume, cut) > high:
            # The latest outputs do not fit whole: all but the newest may go, oldest
            # first, as far as the budget needs (rather than the 400).
            now = prompts[k] + held(first, resume, cut)
            newest = max(cut, bisect_left(pos, e) - 1)
            cut = min(bisect_left(saved, saved[cut] + now - high, cut, newest + 1), newest)
        k = bisect_right(prompts, high - held(first, resume, cut), k + 1)
    return cut, first, resume


def _dropping(
    ends: Sequence[int],
    k: int,
    starts: Sequence[int],
    first: int,
    resume: int,
    pos: Sequence[int],
    keep: int,
) -> list[tuple[int, int]]:
    """Where the kept part may begin at step k, each (turn, resume), oldest dropped
    first: at each later turn whole, then inside the turn request k ended in after
    each of its rounds, up to the round that holds the oldest of the latest ``keep``
    outputs (the newest round when ``keep`` is 0)."""
    e = ends[k]
    last = bisect_right(starts, e - 1) - 1
    options = [(t, starts[t]) for t in range(first + 1, last + 1)]
    cap = ends[k - 1] if k else 0  # the newest round's start
    if keep:
        m = bisect_left(pos, e)
        oldest_whole = pos[m - keep] if m >= keep else -1
        cap = min(cap, ends[bisect_right(ends, oldest_whole) - 1] if oldest_whole >= 0 else 0)
    floor = max(resume, starts[last] + 1) if first == last else starts[last] + 1
    for b in ends[bisect_right(ends, floor) : k]:
        if b > cap:
            break
        options.append((last, b))
    return options


def _held(
    acc: Sequence[int],
    overhead: int,
    turns: Turns,
    first: int,
    resume: int,
    pos: Sequence[int],
    saved: Sequence[int],
    cut: int,
    policy: TrimPolicy,
) -> Climb:
    """What ``_replay`` keeps: the head, turn ``first``'s opening message and everything
    from ``resume`` on, the first ``cut`` clearable outputs cleared; the refusal when
    even that is over the budget."""
    assert policy.budget is not None
    n = len(acc) - 1
    start = turns.starts[first]
    opening = acc[start + 1] - acc[start] if resume > start else 0
    d = bisect_left(pos, resume)
    freed = saved[max(cut, d)] - saved[d]
    tokens = overhead + acc[turns.head] + opening + acc[n] - acc[resume] - freed
    if tokens > policy.budget:
        raise context_length_exceeded(tokens, policy.limit or PromptLimit(policy.budget))
    kept = (*range(turns.head), *([start] if resume > start else []), *range(resume, n))
    cleared = tuple(pos[d:cut])
    reason = "budget" if len(kept) < n else (CLEARED if cleared else None)
    return Climb(kept, cleared, tokens, reason, freed)


def _inside_last_turn(
    roles: Sequence[Message],
    count: PromptCount,
    outputs: Sequence[int],
    ends: Sequence[int],
    policy: TrimPolicy,
    keep: int,
) -> TrimResult:
    """Rung 3: the head and the last turn alone are over the budget (every earlier turn
    is dropped): drop the last turn's oldest rounds, the message that opened it kept.

    A round runs from a request's end to the next one (an assistant's calls and their
    outputs: pairs whole). Its replay is ``proxy.trimming``'s over turns, with a round
    for a turn: step k is the request that ended after round k, and the cut never
    passes the round that holds the oldest of that request's latest ``keep`` outputs.
    """
    assert policy.budget is not None
    per = count.per_message
    n = len(per)
    turns = split_turns(roles)
    if not turns.starts:  # the head alone is over
        tokens = count.overhead + sum(per)
        raise context_length_exceeded(tokens, policy.limit or PromptLimit(policy.budget))
    opening = turns.starts[-1]
    bounds = [e for e in ends if e > opening + 1 and e < n]
    bounds.insert(0, opening + 1)
    acc = list(accumulate(per, initial=0))
    fixed = count.overhead + acc[turns.head] + per[opening]
    prefix = [acc[b] - acc[bounds[0]] for b in bounds]
    prefix.append(acc[n] - acc[bounds[0]])
    high = policy.budget - fixed
    low = max(0, int(policy.budget * policy.target)) - fixed
    rounds = len(bounds)
    cut = 0
    for k in range(rounds):
        prompt = prefix[k + 1]
        if prompt - prefix[cut] <= high:
            continue
        end = bounds[k + 1] if k + 1 < rounds else n
        most = min(k, _keeps_from(outputs, bounds, end, keep, k))
        cut = max(cut, _cut_within(prefix, cut, most, prompt, low, high))
    tokens = fixed + prefix[-1] - prefix[cut]
    if tokens > policy.budget:
        raise context_length_exceeded(tokens, policy.limit or PromptLimit(policy.budget))
    kept = (*range(turns.head), opening, *range(bounds[cut], n))
    return TrimResult(kept, tokens, "budget")


def _keeps_from(outputs: Sequence[int], bounds: Sequence[int], end: int, keep: int, k: int) -> int:
    """The first round the request that ended at ``end`` keeps whatever the
    budget: the one holding the oldest of its latest ``keep`` outputs (round k, the
    newest, when ``keep`` is 0)."""
    if keep <= 0:
        return k
    m = bisect_left(outputs, end)
    if m < keep:
        return 0
    return max(0, bisect_right(bounds, outputs[m - keep]) - 1)


def _cut_within(
    prefix: Sequence[int], cut: int, most: int, prompt: int, low: int, high: int
) -> int:
    """The first kept round once a step is over: forward to the low-water mark, else
    as far as the budget needs, at worst to ``most``."""
    c = bisect_left(prefix, prompt - low, cut, most)
    if prompt - prefix[c] > low:
        c = bisect_left(prefix, prompt - high, cut, most)
    return c


def with_cleared(
    items: Sequence[object], cleared: Sequence[int], clear: ClearOne, counts: Sequence[int]
) -> list[object]:
    """Every item in place, the ``cleared`` ones rendered cleared by ``clear(item,
    tokens)`` (``tokens``: what the output held, ``counts[i]``); the rest the client's
    own objects."""
    out = list(items)
    for i in cleared:
        out[i] = clear(items[i], counts[i])
    return out
