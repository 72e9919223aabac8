"""The chat dialect's parse: each malformed body answered with what to send, and the
roles it reads on the way (whether a tool output is among them, for the trim ladder)."""

from __future__ import annotations

import orjson
import pytest

from proxy.dialects.chat import parse_chat
from proxy.errors import InvalidRequest

_USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        (None, "'messages' is required"),
        ({}, "'messages' must be a list"),
        ([], "at least one message"),
        ([_USER, 3], "messages[1] must be an object"),
        ([_USER, "user"], "messages[1] must be an object"),
        ([["role"]], "messages[0] must be an object"),
        ([_USER, None], "messages[1] must be an object"),
        ([_USER, {"content": "x"}], "messages[1] has no 'role' string"),
        ([_USER, _USER, {"role": None}], "messages[2] has no 'role' string"),
        ([{"role": 5}, {"content": "x"}], "messages[0] has no 'role' string"),
    ],
)
def test_a_malformed_message_is_named(messages: object, words: str) -> None:
    body = {"model": "m"} if messages is None else {"model": "m", "messages": messages}
    with pytest.raises(InvalidRequest) as info:
        parse_chat(orjson.dumps(body))
    assert words in info.value.message
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    ("roles", "told"),
    [
        (["system", "user", "assistant", "user"], False),
        (["user", "assistant", "tool", "user"], True),
        (["tool"], True),
        (["user", "Tool", "tools"], False),  # the role is matched exactly, as trimming does
    ],
)
def test_the_parse_tells_whether_a_tool_output_is_there(roles: list[str], told: bool) -> None:
    messages = [{"role": r, "content": "x"} for r in roles]
    chat = parse_chat(orjson.dumps({"model": "m", "messages": messages}))
    assert chat.holds_tool_role is told
    assert chat.holds_tool_role == any(m["role"] == "tool" for m in chat.roles)
    assert chat.items == messages
