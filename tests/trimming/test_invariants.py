"""Property tests: every invariant of docs/architecture.md §6 over generated conversations."""

from __future__ import annotations

import copy
from itertools import accumulate, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import ContextLengthExceeded
from proxy.trimming import TrimPolicy, Turns, _turn_sums, fits_whole, split_turns, trim
from proxy.types import Message, PromptCount
from tests.support.properties import examples
from tests.trimming.strategies import PROPS, cases, must_keep


@PROPS
@given(cases())
def test_invariants(case: tuple[list[Message], PromptCount, TrimPolicy]) -> None:
    messages, count, policy = case
    original = copy.deepcopy(messages)
    needed = sum(count.per_message[i] for i in must_keep(messages)) + count.overhead
    assert policy.budget is not None
    try:
        result = trim(messages, count, policy)
    except ContextLengthExceeded as exc:
        # 4: refused exactly when the system block plus the last turn cannot fit.
        assert needed > policy.budget
        assert exc.code == "context_length_exceeded"
        return
    assert needed <= policy.budget
    kept = list(result.kept)
    assert messages == original  # pure: the input is not touched
    # 1: an ordered subsequence of the input.
    assert kept == sorted(set(kept))
    assert all(0 <= i < len(messages) for i in kept)
    # 2 and 3: leading system block, last user message and everything after it.
    assert must_keep(messages) <= set(kept)
    # 4: the counted prompt is within the budget, and reported exactly.
    tokens = count.overhead + sum(count.per_message[i] for i in kept)
    assert tokens == result.tokens <= policy.budget
    # 5: whole turns only, tool calls never without their results and vice versa.
    turns = split_turns(messages)
    bounds = (*turns.starts, len(messages))
    for a, b in pairwise(bounds):
        inside = [i in result.kept for i in range(a, b)]
        assert all(inside) or not any(inside)
    kept_msgs = [messages[i] for i in kept]
    call_ids = {c["id"] for m in kept_msgs for c in m.get("tool_calls") or []}
    result_ids = {m["tool_call_id"] for m in kept_msgs if m["role"] == "tool"}
    assert call_ids == result_ids
    # 6: once anything was dropped, the history after the system block opens with a user.
    if len(kept) < len(messages):
        rest = [messages[i] for i in kept if i >= turns.head]
        assert rest and rest[0]["role"] == "user"
        assert result.reason is not None
    # 8: the count bound (plus the pinned first turn).
    if policy.max_history_turns is not None:
        kept_turns = sum(1 for a in turns.starts if a in result.kept)
        assert kept_turns <= policy.max_history_turns + (1 if policy.pin_first_user else 0)


@PROPS
@given(cases())
def test_turns_open_at_the_first_message_after_the_head_and_at_every_user_message(
    case: tuple[list[Message], PromptCount, TrimPolicy],
) -> None:
    messages, count, _ = case
    per = count.per_message
    roles = [m["role"] for m in messages]
    n = len(roles)
    head = next((i for i, r in enumerate(roles) if r not in ("system", "developer")), n)
    starts = sorted({i for i in range(head + 1, n) if roles[i] == "user"} | {head} - {n})
    got = split_turns(messages)
    assert (got.head, list(got.starts)) == (head, starts)
    sums = _turn_sums(list(accumulate(per, initial=0)), list(got.starts))
    assert sums == [sum(per[a:b]) for a, b in pairwise((*starts, n))]
    assert got.first_is_user == (head == n or roles[head] == "user")
    assert got == Turns(head, tuple(starts), got.first_is_user)


@PROPS
@given(cases())
def test_nothing_dropped_when_it_fits(case: tuple[list[Message], PromptCount, TrimPolicy]) -> None:
    messages, count, policy = case
    assert policy.budget is not None
    unbounded = TrimPolicy(budget=count.total + policy.budget % 7, target=policy.target)
    result = trim(messages, count, unbounded)
    assert result.kept == tuple(range(len(messages)))
    assert result.reason is None


def _step_by_step(policy: TrimPolicy, messages: list[Message], budget: int | None) -> TrimPolicy:
    """``policy`` with a turn limit that can never bind (more turns than messages): the
    same trim, through the replay loop that visits every step."""
    return TrimPolicy(
        budget=budget,
        target=policy.target,
        max_history_turns=len(messages) + 1,
        pin_first_user=policy.pin_first_user,
    )


@PROPS
@given(cases())
def test_the_fits_whole_shortcut_agrees_with_the_replay(
    case: tuple[list[Message], PromptCount, TrimPolicy],
) -> None:
    # The chat route skips trimming when fits_whole says so; the replay, run on the
    # same conversation, must then keep everything too. A turn limit that can never
    # bind (more turns than messages) sends the request the long way.
    messages, count, policy = case
    assert policy.budget is not None
    budget = count.total + policy.budget % 7
    assert fits_whole(count.total, budget, None)
    long_way = _step_by_step(policy, messages, budget)
    assert not fits_whole(count.total, budget, long_way.max_history_turns)
    result = trim(messages, count, long_way)
    assert result.kept == tuple(range(len(messages)))
    assert (result.tokens, result.reason) == (count.total, None)
    assert not fits_whole(count.total + 1, count.total, None)


def _outcome(
    messages: list[Message], count: PromptCount, policy: TrimPolicy
) -> tuple[tuple[int, ...], int, str | None] | str:
    try:
        result = trim(messages, count, policy)
    except ContextLengthExceeded as exc:
        return exc.message
    return result.kept, result.tokens, result.reason


@PROPS
@given(cases())
def test_the_bisected_budget_replay_agrees_with_the_step_by_step_one(
    case: tuple[list[Message], PromptCount, TrimPolicy],
) -> None:
    # With a budget and no turn limit the replay bisects for the steps over the budget
    # and for each cut; a turn limit that can never bind (more turns than messages)
    # sends the same conversation through the loop that visits every step.
    messages, count, policy = case
    bisected = TrimPolicy(
        budget=policy.budget, target=policy.target, pin_first_user=policy.pin_first_user
    )
    step_by_step = _step_by_step(policy, messages, policy.budget)
    assert _outcome(messages, count, bisected) == _outcome(messages, count, step_by_step)


@st.composite
def growing(draw: st.DrawFn) -> tuple[list[list[Message]], list[int], TrimPolicy]:
    """A chat as a client sends it: the whole history plus one new user message.

    Turns are small next to the budget (at most 80 of at least 300 tokens), the
    common case the low-water mark is designed for.
    """
    system: Message = {"role": "system", "content": "You are terse."}
    history: list[Message] = [system]
    requests = []
    for k in range(draw(st.integers(10, 40))):
        requests.append([*history, {"role": "user", "content": f"u{k}"}])
        history += [requests[-1][-1], {"role": "assistant", "content": f"a{k}"}]
    sizes = [draw(st.integers(5, 40)) for _ in history]
    policy = TrimPolicy(budget=draw(st.integers(300, 1200)), target=0.6)
    return requests, sizes, policy


@settings(max_examples=examples(150), deadline=None)
@given(growing())
def test_prefix_stable_between_cuts(
    case: tuple[list[list[Message]], list[int], TrimPolicy],
) -> None:
    requests, sizes, policy = case
    assert policy.budget is not None
    previous: list[Message] | None = None
    previous_first = 0
    previous_was_cut = False
    for req in requests:
        result = trim(req, PromptCount(tuple(sizes[: len(req)]), 10), policy)
        forwarded = [req[i] for i in result.kept]
        first = result.kept[1]
        if previous is not None:
            extends = forwarded[: len(previous)] == previous
            cut = first > previous_first
            # Every request either extends the previous prompt or cuts.
            assert extends != cut
            if cut:
                # A cut goes down to the low-water mark, so it is never followed by
                # another at once: the prompt shrank, it did not slide by one turn.
                assert not previous_was_cut
                assert result.tokens <= policy.budget * policy.target
            previous_was_cut = cut
        previous, previous_first = forwarded, first


def test_prefix_stability_worked_example() -> None:
    """Ten turns of 20 tokens under a budget of 100: cut at 5 and 8, extend between."""
    system = {"role": "system", "content": "s"}
    history: list[Message] = [system]
    kept_firsts = []
    for k in range(10):
        history.append({"role": "user", "content": f"u{k}"})
        count = PromptCount(tuple([10] * len(history)), 5)
        result = trim(history, count, TrimPolicy(budget=100, target=0.6))
        kept_firsts.append(result.kept[1])
        history.append({"role": "assistant", "content": f"a{k}"})
    assert kept_firsts == [1, 1, 1, 1, 7, 7, 7, 13, 13, 13]


def test_session_reset_point_drops_earlier_turns() -> None:
    msgs: list[Message] = [{"role": "system", "content": "s"}]
    for k in range(4):
        msgs += [{"role": "user", "content": f"u{k}"}, {"role": "assistant", "content": f"a{k}"}]
    msgs.append({"role": "user", "content": "now"})
    count = PromptCount(tuple([1] * len(msgs)), 0)
    result = trim(msgs, count, TrimPolicy(budget=None), history_start=7)
    assert [msgs[i]["content"] for i in result.kept] == ["s", "u3", "a3", "now"]
    assert result.reason == "session"


def test_pin_first_user_keeps_it_and_gives_way_when_it_cannot_fit() -> None:
    msgs: list[Message] = [{"role": "system", "content": "s"}]
    for k in range(6):
        msgs += [{"role": "user", "content": f"u{k}"}, {"role": "assistant", "content": f"a{k}"}]
    msgs.append({"role": "user", "content": "now"})
    count = PromptCount(tuple([10] * len(msgs)), 0)
    pinned = trim(msgs, count, TrimPolicy(budget=60, pin_first_user=True))
    assert [msgs[i]["content"] for i in pinned.kept][:3] == ["s", "u0", "a0"]
    big = PromptCount((10, 500, *([10] * (len(msgs) - 2))), 0)
    unpinned = trim(msgs, big, TrimPolicy(budget=60, pin_first_user=True))
    assert 1 not in unpinned.kept


def test_refuses_when_last_turn_alone_is_too_big() -> None:
    msgs: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    with pytest.raises(ContextLengthExceeded) as info:
        trim(msgs, PromptCount((10, 95), 0), TrimPolicy(budget=100))
    assert "105" in info.value.message and "100" in info.value.message
