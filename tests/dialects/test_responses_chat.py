"""The Responses parse and chat view take the common item's short way (a plain message
decided inline, every item read in one pass) to the same outcome as the long way: the
turn roles of each item's own role and pair keys, and the chat messages ``_from_item``
builds one item at a time; the client's items are never written into."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.dialects import responses
from proxy.dialects.conversation import Conversation, turn_roles
from proxy.dialects.responses_chat import _from_item, to_chat
from proxy.pipeline.table import builtin_dialects
from proxy.types import Message
from tests.support.properties import examples

PROPS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ROLES = st.sampled_from(["user", "assistant", "system", "developer"])
TEXTS = st.sampled_from(["hi", "", "the report", "x" * 40])
CALL_IDS = st.sampled_from(["c1", "c2", "c3"])


@st.composite
def _item(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 11))
    role, text, call_id = draw(ROLES), draw(TEXTS), draw(CALL_IDS)
    if shape <= 3:  # the common one: a role and a text
        return {"role": role, "content": text}
    if shape == 4:
        return {"type": "message", "role": role, "content": text, "id": "m1"}
    if shape == 5:
        parts = [{"type": "output_text" if role == "assistant" else "input_text", "text": text}]
        return {"type": "message", "role": role, "content": parts}
    if shape == 6:
        return {"role": role, "content": draw(st.sampled_from([None, [], 7]))}
    if shape == 7:
        kind = draw(st.sampled_from(["function_call", "custom_tool_call"]))
        return {"type": kind, "call_id": call_id, "name": "f", "arguments": "{}", "input": text}
    if shape == 8:
        kind = draw(st.sampled_from(["function_call_output", "custom_tool_call_output"]))
        return {"type": kind, "call_id": call_id, "output": text}
    if shape == 9:
        return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    if shape == 10:
        kind = draw(st.sampled_from(["mcp_approval_request", "mcp_approval_response"]))
        return {"type": kind, "id": call_id, "approval_request_id": call_id}
    return {"type": draw(st.sampled_from([None, "web_search_call"])), "role": role}


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "input": draw(st.lists(_item(), max_size=12))}
    if draw(st.booleans()):
        body["instructions"] = draw(TEXTS)
    if draw(st.integers(0, 5)) == 0:
        body["input"] = draw(TEXTS)
    return body


def _one_at_a_time(conv: Conversation, kept: Sequence[int]) -> tuple[list[Message], list[int]]:
    """The chat view built by ``_from_item`` alone, item by item."""
    out: list[Message] = []
    owner: list[int] = []
    for i in kept:
        item = conv.items[i]
        if i < conv.head:
            message: Message | None = {"role": "system", "content": item}
        elif isinstance(item, str):
            message = {"role": "user", "content": item}
        else:
            message = _from_item(item, out[-1] if out else None)
        if message is not None:
            out.append(message)
            owner.append(i)
    return out, owner


def _own_role(item: Any) -> str:
    if isinstance(item, str):
        return "user"
    kind, role = item.get("type"), item.get("role")
    if (kind is None or kind == "message") and isinstance(role, str):
        return str(role)
    return "tool" if isinstance(kind, str) and kind.endswith("_output") else "assistant"


def _pair_keys(item: Any) -> tuple[str, ...]:
    if isinstance(item, str):
        return ()
    kind = item.get("type")
    name = {"mcp_approval_request": "id", "mcp_approval_response": "approval_request_id"}
    key = item.get(name.get(kind, "call_id"))
    return (key,) if isinstance(key, str) else ()


@PROPS
@given(body=bodies(), data=st.data())
def test_the_short_ways_end_where_the_long_ways_do(body: dict[str, Any], data: Any) -> None:
    conv = responses.parse(orjson.dumps(body))
    entries = conv.items[conv.head :]
    kinds = ["system"] * conv.head + [_own_role(item) for item in entries]
    keys = [()] * conv.head + [_pair_keys(item) for item in entries]
    assert conv.roles == turn_roles(kinds, keys)
    client = copy.deepcopy(conv.items)
    everything = range(len(conv.items))
    some = sorted(data.draw(st.sets(st.sampled_from(list(everything)))) if conv.items else [])
    for kept in (everything, some):
        assert to_chat(conv, kept) == _one_at_a_time(conv, kept)
    assert conv.items == client  # nothing written into the client's items


@st.composite
def plain_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Lists of messages of a role and a content, the common stateless list, now and
    then one that is not plain (an id, a content that is not text, two assistants in a
    row), with and without instructions."""

    def message(shape: int, role: str, text: str) -> dict[str, Any]:
        if shape == 0:
            return {"type": "message", "role": role, "content": text, "id": "m1"}
        if shape == 1:
            return {"role": role, "content": [{"type": "input_text", "text": text}]}
        return {"role": role, "content": text}

    shapes = st.integers(0, 12)
    items = draw(st.lists(st.builds(message, shapes, ROLES, TEXTS), max_size=12))
    body: dict[str, Any] = {"model": "m", "input": items}
    if draw(st.booleans()):
        body["instructions"] = draw(TEXTS.filter(bool))
    return body


@PROPS
@given(body=st.one_of(plain_bodies(), bodies()))
def test_a_plain_list_is_its_own_chat_view(body: dict[str, Any]) -> None:
    """Where the parse takes every item for a chat message as it stands, the chat view
    is the items (the instructions a system message), one message an item: what
    ``_from_item`` builds one at a time."""
    conv = responses.parse(orjson.dumps(body))
    dialect = next(d for d in builtin_dialects() if d.endpoint == "responses")
    messages, owner = _one_at_a_time(conv, range(len(conv.items)))
    view = dialect.chat_view(conv)
    assert view.messages == messages
    assert (list(range(len(conv.items))) if view.owner is None else view.owner) == owner
    entries = body["input"] if isinstance(body["input"], list) else None
    plain = entries is not None and all(_plain(entries, i) for i in range(len(entries)))
    assert (conv.plain_for is conv.items) == plain
    if plain and conv.items:
        # A copy with other items is not taken for plain: its view is built again.
        fewer = replace(conv, items=conv.items[:-1])
        assert (
            dialect.chat_view(fewer).messages == _one_at_a_time(fewer, range(len(fewer.items)))[0]
        )


def _plain(entries: list[Any], i: int) -> bool:
    """Whether ``to_chat`` gives item ``i`` back as it stands: a message with a role
    string, an assistant's only as a bare text not after another assistant's."""
    m = entries[i]
    if m.get("type") not in (None, "message") or not isinstance(m.get("role"), str):
        return False
    if m["role"] != "assistant":
        return True
    after = i > 0 and entries[i - 1].get("role") == "assistant"
    return len(m) == 2 and isinstance(m.get("content"), str) and not after
