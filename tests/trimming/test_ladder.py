"""Property tests of the trim ladder (docs/architecture.md §6, the trim ladder) over
generated agent conversations: earlier turns, then a task of many tool rounds."""

from __future__ import annotations

import copy
import subprocess
import sys
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from proxy.dialects.tool_outputs import CHAT
from proxy.errors import ContextLengthExceeded
from proxy.ladder import ClearOne, Climb, _split, climb, placeholder, request_ends
from proxy.trimming import TrimPolicy, split_turns
from proxy.types import Message, PromptCount
from tests.trimming.strategies import PROPS, TEXTS, conversations, tool_exchange, turn

Case = tuple[list[Message], PromptCount, list[int], TrimPolicy, int]


def forwarded(
    items: Sequence[object], climbed: Climb, clear: ClearOne, counts: Sequence[int]
) -> list[object]:
    """The items a climb forwards: the kept ones, the cleared outputs rendered cleared
    (what ``proxy.ladder_step`` renders from ``with_cleared`` and the kept indices)."""
    kept = climbed.kept
    out = list(map(items.__getitem__, kept))
    for i in climbed.cleared:
        out[bisect_left(kept, i)] = clear(items[i], counts[i])
    return out


@st.composite
def agent_cases(draw: st.DrawFn) -> Case:
    ids = [0]
    messages: list[Message] = [
        {"role": "system", "content": draw(TEXTS)} for _ in range(draw(st.integers(0, 2)))
    ]
    for _ in range(draw(st.integers(0, 3))):
        messages.extend(draw(turn(ids)))
    messages.append({"role": "user", "content": draw(TEXTS)})
    for _ in range(draw(st.integers(0, 25))):
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "assistant", "content": draw(TEXTS)})
        messages.extend(draw(tool_exchange(ids)))
    per = tuple(
        draw(st.integers(1, 400 if m["role"] == "tool" else 120)) for m in messages
    )  # fmt: skip
    cleared = [draw(st.integers(1, 30)) for m in messages if m["role"] == "tool"]
    policy = TrimPolicy(
        budget=draw(st.integers(50, 4000)),
        target=draw(st.sampled_from([0.5, 0.6, 0.8, 1.0])),
    )
    return messages, PromptCount(per, draw(st.integers(0, 20))), cleared, policy, draw(
        st.integers(0, 4)
    )  # fmt: skip


def _outputs(messages: Sequence[Message]) -> list[int]:
    return CHAT.find(messages)


def _climb(case: Case, upto: int | None = None) -> Climb:
    messages, count, cleared, policy, keep = case
    n = len(messages) if upto is None else upto
    outputs = [i for i in _outputs(messages) if i < n]
    part = PromptCount(count.per_message[:n], count.overhead)
    return climb(messages[:n], part, outputs, cleared[: len(outputs)], policy, keep=keep)


def _counts(case: Case, climbed: Climb) -> int:
    messages, count, cleared, _, _ = case
    by_output = dict(zip(_outputs(messages), cleared, strict=True))
    gone = set(climbed.cleared)
    return count.overhead + sum(
        by_output[i] if i in gone else count.per_message[i] for i in climbed.kept
    )


@PROPS
@given(agent_cases())
def test_the_ladder_keeps_its_invariants(case: Case) -> None:
    """Order kept; the head and the message that opened the last turn kept; the latest
    outputs whole; no pair split; the count exact and within the budget; pure."""
    messages, _, _, policy, keep = case
    original = copy.deepcopy(messages)
    try:
        climbed = _climb(case)
    except ContextLengthExceeded:
        return
    assert messages == original
    kept = list(climbed.kept)
    assert kept == sorted(set(kept))
    turns = split_turns(messages)
    assert set(range(turns.head)) <= set(kept)
    assert turns.starts[-1] in kept
    outputs = _outputs(messages)
    assert set(climbed.cleared) <= set(kept) & set(outputs)
    latest = outputs[len(outputs) - keep :] if keep else []
    for i in latest:
        assert i in kept or i < turns.starts[-1]  # only rung 2 drops one, with its turn
    if set(latest) & set(climbed.cleared):  # only when they do not fit whole
        assert outputs[-1] not in climbed.cleared
        whole = replace(climbed, cleared=tuple(i for i in climbed.cleared if i not in latest))
        assert _counts(case, whole) > (policy.budget or 0)
    assert climbed.tokens == _counts(case, climbed) <= (policy.budget or 0)
    sent = [messages[i] for i in kept]
    calls = {c["id"] for m in sent for c in m.get("tool_calls") or []}
    assert calls == {m["tool_call_id"] for m in sent if m["role"] == "tool"}
    rest = [m for m in sent[turns.head :]]
    assert rest[0]["role"] == "user"
    assert climbed == _climb(copy.deepcopy(case))  # no state


def _round(k: int) -> list[Message]:
    call = {"id": f"call_{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{k}", "content": "hello"},
    ]


# Found by hypothesis: two user messages in a row over the budget, then the first tool
# output; the ladder's replay must take trim's steps up to it (it cut to the low-water
# mark at the second user message, and the prompt that held 50 of 50 changed).
_TWO_USERS_THEN_A_TOOL: Case = (
    [
        {"role": "system", "content": "hello"},
        {"role": "user", "content": None},
        {"role": "system", "content": "hello"},
        {"role": "assistant", "content": "hello"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "hello"},
        *_round(1),
        *_round(2),
    ],
    PromptCount((1, 1, 1, 1, 1, 46, 1, 1, 1, 1, 1), 0),
    [1, 1],
    TrimPolicy(budget=50, target=0.5),
    0,
)


@PROPS
@given(agent_cases())
@example(_TWO_USERS_THEN_A_TOOL)
def test_a_prompt_changes_only_when_its_held_form_is_over(case: Case) -> None:
    """Replayed request by request, as the agent sent them: each forwarded prompt begins
    with the one before, unless that one and what came since would be over the budget
    (the clearing or the cut happens on exactly those requests)."""
    messages, count, _, policy, _ = case
    assert policy.budget is not None
    head = split_turns(messages).head
    before: list[tuple[int, bool]] | None = None
    before_tokens = 0
    before_end = 0
    for end in request_ends(messages, head):
        try:
            climbed = _climb(case, end)
        except ContextLengthExceeded:
            before = None
            continue
        now = [(i, i in climbed.cleared) for i in climbed.kept]
        if before is not None and now[: len(before)] != before:
            grown = before_tokens + sum(count.per_message[before_end:end])
            assert grown > policy.budget, (before, now)
        before, before_tokens, before_end = now, climbed.tokens, end


def _call(call_id: str) -> Message:
    call = {"id": call_id, "type": "function", "function": {"name": "read", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_a_cleared_output_says_what_it_held_and_keeps_its_pair() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "fix the bug"},
        _call("c1"),
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 4000},
        _call("c2"),
        {"role": "tool", "tool_call_id": "c2", "content": "y" * 4000},
    ]
    count = PromptCount((5, 10, 1000, 10, 1000), 3)
    policy = TrimPolicy(budget=1200, target=0.6)
    climbed = climb(messages, count, [2, 4], [20, 20], policy, keep=1)
    assert climbed.kept == (0, 1, 2, 3, 4) and climbed.cleared == (2,)
    assert climbed.tokens == 3 + 5 + 10 + 20 + 10 + 1000 and climbed.reason == "cleared"
    sent = forwarded(messages, climbed, CHAT.clear, count.per_message)
    assert sent[2] == {"role": "tool", "tool_call_id": "c1", "content": placeholder(1000)}
    assert sent[4] is messages[4] and sent[1] is messages[1]


def test_the_same_answer_from_a_fresh_process() -> None:
    """No state: another interpreter climbs the same conversation to the same answer."""
    messages: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for k in range(40):
        messages.append(_call(f"c{k}"))
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": str(k)})
    per = [50, 20] + [10 if m["role"] == "assistant" else 300 for m in messages[2:]]
    outputs = _outputs(messages)
    policy = TrimPolicy(budget=3000, target=0.6)
    here = climb(messages, PromptCount(tuple(per), 7), outputs, [12] * len(outputs), policy)
    script = (
        "import sys, orjson\n"
        "from proxy.ladder import climb\n"
        "from proxy.trimming import TrimPolicy\n"
        "from proxy.types import PromptCount\n"
        "m, per, outs = orjson.loads(sys.stdin.buffer.read())\n"
        "c = climb(m, PromptCount(tuple(per), 7), outs, [12] * len(outs),"
        " TrimPolicy(budget=3000, target=0.6))\n"
        "print(orjson.dumps([c.kept, c.cleared, c.tokens]).decode())\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", script],
        input=orjson.dumps([messages, per, outputs]),
        capture_output=True,
        check=True,
    )
    assert orjson.loads(there.stdout) == [list(here.kept), list(here.cleared), here.tokens]
    assert here.cleared and here.tokens <= 3000


@PROPS
@given(conversations())
def test_the_ladders_turns_are_trimmings(messages: list[Message]) -> None:
    """The ladder reads the roles once (``_split``); its turns are ``split_turns``'."""
    assert _split([m.get("role") for m in messages]) == split_turns(messages)
