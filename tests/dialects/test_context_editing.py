"""``proxy.dialects.context_editing``, the pure part of Anthropic context editing: every
parameter of ``clear_tool_uses_20250919`` and ``clear_thinking_20251015`` as Anthropic
documents it, the checks that refuse a bad ``context_management``, and properties over
random tool loops (the latest tool uses whole, every pair whole, the rest untouched)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects import context_editing as ce
from proxy.errors import InvalidRequest
from proxy.types import JSONObject


async def count(messages: list[JSONObject]) -> int:
    """A stand-in for the route's counter: one token per four bytes of JSON."""
    return len(orjson.dumps(messages)) // 4


def loop(rounds: int, *, names: list[str] | None = None, size: int = 400) -> list[JSONObject]:
    """A task and ``rounds`` tool rounds: a call, then its output of ``size`` bytes."""
    out: list[JSONObject] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(rounds):
        name = names[i % len(names)] if names else "read_file"
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"path": f"f{i}"}}
        out.append({"role": "assistant", "content": [{"type": "text", "text": "Look."}, call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "x" * size}
        out.append({"role": "user", "content": [result]})
    return out


def results(messages: list[JSONObject]) -> list[Any]:
    return [
        block["content"]
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]


def inputs(messages: list[JSONObject]) -> list[Any]:
    return [use["input"] for _, _, use in ce.tool_uses(messages)]


def edits(*entries: JSONObject) -> list[ce.Edit]:
    parsed = ce.parse({"context_management": {"edits": list(entries)}})
    assert parsed is not None
    return parsed


def tool_edit(**fields: Any) -> list[ce.Edit]:
    return edits({"type": ce.CLEAR_TOOL_USES, **fields})


LOW = {"type": "input_tokens", "value": 10}


async def test_no_field_no_edits_and_an_empty_list_edits_nothing() -> None:
    assert ce.parse({"model": "m"}) is None
    assert ce.parse({"context_management": {}}) == []
    messages = loop(6)
    done = await ce.apply([], messages, count)
    assert done.messages is messages and done.applied == []


async def test_defaults_trigger_at_100k_input_tokens_and_keep_three() -> None:
    (edit,) = tool_edit()
    assert edit == ce.ClearToolUses("input_tokens", 100_000, 3, 0, frozenset(), False)
    small = loop(8)
    assert (await ce.apply([edit], small, count)).applied == []  # not over the trigger
    big = loop(8, size=60_000)  # ~120k tokens of output
    done = await ce.apply([edit], big, count)
    assert results(done.messages) == [ce.PLACEHOLDER] * 5 + ["x" * 60_000] * 3
    (applied,) = done.applied
    assert applied["type"] == ce.CLEAR_TOOL_USES and applied["cleared_tool_uses"] == 5
    assert applied["cleared_input_tokens"] == done.original_tokens - done.tokens > 0
    assert done.tokens == await count(done.messages)


async def test_the_trigger_is_exceeded_not_reached() -> None:
    messages = loop(5)
    tokens = await count(messages)
    at = tool_edit(trigger={"type": "input_tokens", "value": tokens})
    assert (await ce.apply(at, messages, count)).applied == []
    below = tool_edit(trigger={"type": "input_tokens", "value": tokens - 1})
    assert (await ce.apply(below, messages, count)).applied[0]["cleared_tool_uses"] == 2


async def test_a_trigger_in_tool_uses() -> None:
    five = loop(5)
    assert (
        await ce.apply(tool_edit(trigger={"type": "tool_uses", "value": 5}), five, count)
    ).applied == []
    done = await ce.apply(tool_edit(trigger={"type": "tool_uses", "value": 4}), five, count)
    assert results(done.messages) == [ce.PLACEHOLDER] * 2 + ["x" * 400] * 3


@pytest.mark.parametrize("keep", [0, 1, 3, 7, 9])
async def test_keep_leaves_the_latest_tool_uses_whole(keep: int) -> None:
    messages = loop(7)
    done = await ce.apply(
        tool_edit(trigger=LOW, keep={"type": "tool_uses", "value": keep}), messages, count
    )
    cleared = max(0, 7 - keep)
    assert results(done.messages) == [ce.PLACEHOLDER] * cleared + ["x" * 400] * (7 - cleared)
    assert done.applied == (
        []
        if not cleared
        else [{"type": ce.CLEAR_TOOL_USES, "cleared_tool_uses": cleared,
               "cleared_input_tokens": done.original_tokens - done.tokens}]
    )  # fmt: skip


async def test_clear_at_least_clears_nothing_when_it_cannot_be_reached() -> None:
    messages = loop(6)
    done = await ce.apply(tool_edit(trigger=LOW), messages, count)
    freed = done.applied[0]["cleared_input_tokens"]
    enough = tool_edit(trigger=LOW, clear_at_least={"type": "input_tokens", "value": freed})
    assert (await ce.apply(enough, messages, count)).applied == done.applied
    more = tool_edit(trigger=LOW, clear_at_least={"type": "input_tokens", "value": freed + 1})
    short = await ce.apply(more, messages, count)
    assert (
        short.applied == [] and short.messages is messages and short.tokens == done.original_tokens
    )


async def test_exclude_tools_are_never_cleared() -> None:
    messages = loop(8, names=["memory", "read_file"])
    done = await ce.apply(tool_edit(trigger=LOW, exclude_tools=["memory"]), messages, count)
    # The five oldest are past keep; the memory ones among them stay.
    got = results(done.messages)
    assert got[:5] == ["x" * 400, ce.PLACEHOLDER, "x" * 400, ce.PLACEHOLDER, "x" * 400]
    assert got[5:] == ["x" * 400] * 3
    assert done.applied[0]["cleared_tool_uses"] == 2


async def test_tool_inputs_are_kept_unless_clear_tool_inputs() -> None:
    messages = loop(5, names=["read_file", "grep"])
    kept = await ce.apply(tool_edit(trigger=LOW), messages, count)
    assert inputs(kept.messages) == inputs(messages)
    every = await ce.apply(tool_edit(trigger=LOW, clear_tool_inputs=True), messages, count)
    assert inputs(every.messages) == [{}, {}, {"path": "f2"}, {"path": "f3"}, {"path": "f4"}]
    named = await ce.apply(tool_edit(trigger=LOW, clear_tool_inputs=["grep"]), messages, count)
    assert inputs(named.messages) == [
        {"path": "f0"},
        {},
        {"path": "f2"},
        {"path": "f3"},
        {"path": "f4"},
    ]
    assert every.applied[0]["cleared_input_tokens"] > kept.applied[0]["cleared_input_tokens"]
    # The calls' names and ids stay, so every pair is still whole.
    assert [(u["id"], u["name"]) for _, _, u in ce.tool_uses(every.messages)] == [
        (u["id"], u["name"]) for _, _, u in ce.tool_uses(messages)
    ]


def thinking_turns(turns: int) -> list[JSONObject]:
    """``turns`` user turns, each answered by two assistant messages with thinking
    (a tool loop), the second after a tool result."""
    out: list[JSONObject] = []
    for t in range(turns):
        out.append({"role": "user", "content": f"question {t}"})
        think = {"type": "thinking", "thinking": f"thought {t} " * 20, "signature": "s"}
        call = {"type": "tool_use", "id": f"t{t}", "name": "grep", "input": {}}
        out.append({"role": "assistant", "content": [think, call]})
        out.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{t}", "content": "line " * 40}
                ],
            }
        )
        out.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "r"},
                    {"type": "text", "text": "done"},
                ],
            }
        )
    return out


def thoughts(messages: list[JSONObject]) -> list[int]:
    """Per assistant message, its thinking blocks."""
    return [
        sum(b["type"] in ("thinking", "redacted_thinking") for b in m["content"])
        for m in messages
        if m["role"] == "assistant"
    ]


async def test_clear_thinking_keeps_the_latest_thinking_turns() -> None:
    messages = thinking_turns(4)
    (default,) = edits({"type": ce.CLEAR_THINKING})
    assert default == ce.ClearThinking(keep=1)
    done = await ce.apply([default], messages, count)
    assert thoughts(done.messages) == [0, 0, 0, 0, 0, 0, 1, 1]
    (applied,) = done.applied
    assert applied["type"] == ce.CLEAR_THINKING and applied["cleared_thinking_turns"] == 3
    assert applied["cleared_input_tokens"] == done.original_tokens - done.tokens > 0
    two = edits({"type": ce.CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 2}})
    assert thoughts((await ce.apply(two, messages, count)).messages) == [0, 0, 0, 0, 1, 1, 1, 1]
    for every in ("all", {"type": "all"}):
        kept = await ce.apply(edits({"type": ce.CLEAR_THINKING, "keep": every}), messages, count)
        assert kept.messages is messages and kept.applied == []


async def test_both_edits_apply_in_order_thinking_first() -> None:
    messages = thinking_turns(5)
    done = await ce.apply(
        edits(
            {"type": ce.CLEAR_THINKING},
            {"type": ce.CLEAR_TOOL_USES, "trigger": LOW, "keep": {"type": "tool_uses", "value": 1}},
        ),
        messages,
        count,
    )
    assert [a["type"] for a in done.applied] == [ce.CLEAR_THINKING, ce.CLEAR_TOOL_USES]
    assert done.applied[1]["cleared_tool_uses"] == 4
    assert (
        sum(a["cleared_input_tokens"] for a in done.applied) == done.original_tokens - done.tokens
    )


def _tool(**fields: Any) -> JSONObject:
    return {"edits": [{"type": ce.CLEAR_TOOL_USES, **fields}]}


def _think(keep: Any) -> JSONObject:
    return {"edits": [{"type": ce.CLEAR_THINKING, "keep": keep}]}


def _measure(kind: str, value: Any) -> JSONObject:
    return {"type": kind, "value": value}


BOTH = [{"type": ce.CLEAR_TOOL_USES}, {"type": ce.CLEAR_THINKING}]


@pytest.mark.parametrize(
    ("management", "words"),
    [
        ([], "must be an object"),
        ({"edits": {}}, "must be a list"),
        ({"edits": [], "other": 1}, "context_management.other"),
        ({"edits": [{"type": "compact_20260112"}]}, "'compact_20260112' is not an edit"),
        (_tool(trigger=_measure("turns", 3)), ".trigger must be"),
        (_tool(trigger=_measure("input_tokens", -1)), "trigger.value must be an integer"),
        (_tool(keep=_measure("tool_uses", "3")), "keep.value"),
        (_tool(keep=_measure("input_tokens", 3)), ".keep must be"),
        (_tool(clear_at_least=_measure("tool_uses", 3)), "clear_at_least must be"),
        (_tool(exclude_tools="memory"), "exclude_tools must be a list"),
        (_tool(clear_tool_inputs="yes"), "clear_tool_inputs must be a list"),
        (_tool(keep_last=3), "keep_last: extra inputs"),
        (_think(_measure("thinking_turns", 0)), "keep.value must be an integer of at least 1"),
        (_think("some"), ".keep must be"),
        ({"edits": BOTH}, "must come first"),
        ({"edits": [BOTH[0], BOTH[0]]}, "appear once"),
    ],
)
def test_a_bad_context_management_is_refused_naming_the_field(management: Any, words: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        ce.parse({"context_management": management})
    assert refused.value.param == "context_management"
    assert words in refused.value.message


def test_every_parameter_is_read() -> None:
    (edit,) = tool_edit(
        trigger={"type": "tool_uses", "value": 9},
        keep={"type": "tool_uses", "value": 2},
        clear_at_least={"type": "input_tokens", "value": 500},
        exclude_tools=["memory"],
        clear_tool_inputs=["bash"],
    )
    assert edit == ce.ClearToolUses(
        "tool_uses", 9, 2, 500, frozenset({"memory"}), frozenset({"bash"})
    )
    (nulls,) = tool_edit(
        trigger=None, keep=None, clear_at_least=None, exclude_tools=None, clear_tool_inputs=None
    )
    assert nulls == ce.ClearToolUses()


@given(
    rounds=st.integers(0, 12),
    keep=st.integers(0, 6),
    names=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
    exclude=st.sets(st.sampled_from(["a", "b", "c"])),
    clear_inputs=st.booleans(),
)
def test_clearing_keeps_pairs_whole_and_touches_only_old_results(
    rounds: int, keep: int, names: list[str], exclude: set[str], clear_inputs: bool
) -> None:
    messages = loop(rounds, names=names, size=40)
    before = orjson.dumps(messages)
    edit = ce.ClearToolUses("input_tokens", 0, keep, 0, frozenset(exclude), clear_inputs)
    done = asyncio.run(ce.apply([edit], messages, count))
    assert orjson.dumps(messages) == before  # the client's messages are never changed
    assert len(done.messages) == len(messages)
    uses = ce.tool_uses(messages)
    got = results(done.messages)
    cleared = 0
    for i, (_, _, use) in enumerate(uses):
        old = i < len(uses) - keep and use["name"] not in exclude
        cleared += old
        assert got[i] == (ce.PLACEHOLDER if old else "x" * 40)
        assert inputs(done.messages)[i] == ({} if old and clear_inputs else use["input"])
    assert [a["cleared_tool_uses"] for a in done.applied] == ([cleared] if cleared else [])
    for edited, original in zip(done.messages, messages, strict=True):
        assert edited["role"] == original["role"]
        if edited is not original:  # only messages with a cleared block are copies
            assert edited != original
