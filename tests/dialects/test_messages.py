"""The Messages dialect: parse errors, the trimming view, the chat conversion, render."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects import messages
from proxy.dialects.conversation import Conversation
from proxy.dialects.messages_checks import BLOCKS
from proxy.errors import InvalidRequest
from proxy.tokens.usage import anthropic_input_tokens, upstream_prompt_tokens
from tests.dialects.samples import MESSAGES


def _parse(body: dict[str, Any]) -> Conversation:
    return messages.parse(orjson.dumps(body))


@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (b"{", None, "Send a JSON object with 'model', 'max_tokens' and 'messages'"),
        (b"3", None, "must be a JSON object"),
        (b'{"model": "m"}', "messages", "'messages' must be a non-empty list"),
        (b'{"messages": []}', "messages", "non-empty list"),
        (b'{"messages": [{"content": "x"}]}', "messages", "messages[0] must be an object"),
        (b'{"messages": [{"role": "user"}]}', "messages", "messages[0].content must be"),
        (b'{"messages": [{"role": "user", "content": [1]}]}', "messages", "content block"),
        (b'{"messages": [{"role": "user", "content": "x"}], "system": 1}', "system", "text"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens", ""),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}', "tools", "list"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": [1]}', "tools", "tools[0]"),
    ],
)
def test_parse_errors_say_what_to_send(raw: bytes, param: str | None, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        messages.parse(raw)
    assert info.value.param == param
    assert words in info.value.message


def test_fields_read() -> None:
    conv = _parse(MESSAGES[0] | {"stream": True, "metadata": {"user_id": "u7"}})
    assert (conv.endpoint, conv.model, conv.stream, conv.max_tokens, conv.user) == (
        "messages",
        "m",
        True,
        64,
        "u7",
    )
    assert conv.head == 1 and conv.items[0] == "You are helpful."
    assert conv.tools is not None
    assert conv.tools[0]["function"]["parameters"] == {"properties": {}, "type": "object"}
    assert conv.tools[1]["function"]["strict"] is True
    assert _parse({"messages": [{"role": "user", "content": "x"}], "system": ""}).head == 0


def test_roles_keep_tool_results_in_the_turn_before() -> None:
    conv = _parse(MESSAGES[0])
    assert [r["role"] for r in conv.roles] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    body = {
        "messages": [
            {"role": "user", "content": "a"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
            },
            # a result with text beside it: still inside the pair, so no new turn
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1"},
                    {"type": "text", "text": "x"},
                ],
            },
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nowhere"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ]
    }
    roles = [r["role"] for r in _parse(body).roles]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]
    inline = _parse(MESSAGES[2])
    assert [r["role"] for r in inline.roles] == [
        "system",
        "system",
        "user",
        "assistant",
        "assistant",
        "user",
    ]


def test_to_chat_places_tool_results_before_the_rest_of_the_message() -> None:
    conv = _parse(MESSAGES[0])
    chat, owner = messages.to_chat(conv, range(len(conv.items)))
    use = {
        "id": "t1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "\\u00e9", "n": 1.5}'},
    }
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert chat == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [use, {**use, "id": "t2"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "tool", "tool_call_id": "t2", "content": "line 1\nline 2"},
        {"role": "user", "content": [image]},
        {"role": "assistant", "reasoning": "hmm", "content": "Done."},
        {"role": "tool", "tool_call_id": "t3", "content": ""},
        {"role": "user", "content": "also this"},
    ]
    assert owner == [0, 1, 2, 3, 3, 3, 4, 5, 5]


def test_to_chat_of_odd_blocks() -> None:
    conv = _parse(MESSAGES[1])
    chat, owner = messages.to_chat(conv, range(len(conv.items)))
    assert chat[0] == {"role": "system", "content": "Part one. Part two."}
    assert chat[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }
    assert chat[2] == {"role": "assistant"}  # no content: kept, as vLLM keeps it
    # the user message of one empty text block yields nothing
    assert chat[3] == {
        "role": "assistant",
        "content": "Tool result: [{'type': 'text', 'text': 'inline'}]",
    }
    assert chat[4] == {"role": "tool", "tool_call_id": "t9", "content": ""}
    assert chat[5]["content"] == [{"type": "tool_reference", "name": "lookup"}]
    assert owner == [0, 1, 2, 4, 5, 5, 5]


def test_inline_system_messages_in_place_or_merged() -> None:
    conv = _parse(MESSAGES[2])
    chat, owner = messages.to_chat(conv, range(6))
    assert [m["content"] for m in chat] == [
        "Top.",
        "Leading inline.",
        "one",
        "two",
        "Reminder.",
        "three",
    ]
    assert owner == [0, 1, 2, 3, 4, 5]
    merged, owner = messages.to_chat(conv, range(6), merge_inline_system=True)
    assert merged[0] == {"role": "system", "content": "Top.Leading inline.Reminder."}
    assert owner == [0, 2, 3, 5]
    dropped, _ = messages.to_chat(conv, [0, 1, 5], merge_inline_system=True)
    assert dropped[0]["content"] == "Top.Leading inline."


def test_tool_changes_follow_the_kept_system_messages() -> None:
    conv = _parse(MESSAGES[3])
    assert conv.tools is not None
    assert [t["function"]["name"] for t in conv.tools] == ["lazy", "late"]
    assert "defer_loading" not in conv.tools[0]["function"]
    without = messages.chat_tools(conv, [4, 5])
    assert without is not None
    assert [t["function"] for t in without][1]["defer_loading"] is True


def test_render_keeps_messages_byte_identical() -> None:
    body = MESSAGES[0] | {
        "vendor": {"a": [1.25, None]},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    conv = _parse(body)
    out = orjson.loads(messages.render(conv, [0, 5], 10))
    assert out == {**body, "messages": [body["messages"][4]], "max_tokens": 10}
    assert orjson.dumps(out["messages"][0]) == orjson.dumps(conv.items[5])
    assert orjson.loads(messages.render(conv, range(6), None)) == body


def test_usage() -> None:
    # Anthropic's input_tokens leave out what the prompt cache read: the prompt is the sum.
    answer = {"usage": {"input_tokens": 5, "cache_read_input_tokens": 100, "output_tokens": 7}}
    assert upstream_prompt_tokens(orjson.dumps(answer), anthropic_input_tokens) == 105
    assert upstream_prompt_tokens(b"{}", anthropic_input_tokens) is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        # A malformed later message is named before an earlier unserved role: the
        # shape of the whole list is checked first, as before the checks shared its pass.
        (
            {"messages": [{"role": "tool", "content": "x"}, {"role": "user", "content": 1}]},
            "messages[1].content must be",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
            "messages[1].role must be 'user' or 'assistant', not 'tool'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}]},
                    {"role": "assistant", "content": [{"type": "search_result"}, 2]},
                ]
            },
            "messages[1].content must be",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "text"}, {"type": "document"}]},
                ]
            },
            "messages[1].content[1]: block type 'document' is not served",
        ),
    ],
    ids=["shape-first", "role", "block-shape-first", "block-kind"],
)
def test_the_first_refusal_is_named_shape_before_kind(body: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _parse(body)
    assert info.value.param == "messages"
    assert words in info.value.message


def test_every_served_role_and_block_kind_passes() -> None:
    blocks = [{"type": kind} for kind in sorted(BLOCKS)]
    conv = _parse(
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": blocks},
                {"role": "assistant", "content": []},
            ]
        }
    )
    assert [m["role"] for m in conv.items] == ["system", "user", "assistant"]
