"""The Responses dialect: parse errors, the trimming view, the chat conversion, render."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects import responses
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest
from proxy.tokens.usage import input_tokens, upstream_prompt_tokens
from tests.dialects.samples import RESPONSES


def _parse(body: dict[str, Any]) -> Conversation:
    return responses.parse(orjson.dumps(body))


@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (b"{", None, "not valid JSON"),
        (b"[]", None, "must be a JSON object with 'model' and 'input'"),
        (b'{"model": "m"}', "input", "'input' is required"),
        (b'{"input": 5}', "input", "a string or a list of input items"),
        (b'{"input": [1]}', "input", "input[0] must be an object"),
        (b'{"input": [{"type": "message"}]}', "input", "input[0] is a message without"),
        (b'{"input": [{"content": "x"}]}', "input", "give it 'role'"),
        (b'{"input": "x", "instructions": 3}', "instructions", "a string or null"),
        (b'{"input": "x", "max_output_tokens": 0}', "max_output_tokens", "positive integer"),
        (b'{"input": "x", "max_output_tokens": true}', "max_output_tokens", "positive integer"),
        (b'{"input": "x", "stream": "yes"}', "stream", "true or false"),
        (b'{"input": "x", "model": 1}', "model", "must be a string"),
        (b'{"input": "' + b"[" * 300 + b'"}', None, None),
    ],
)
def test_parse_errors_say_what_to_send(raw: bytes, param: str | None, words: str | None) -> None:
    if words is None:  # a string that looks deep is not deep
        assert responses.parse(raw).items == ["[" * 300]
        return
    with pytest.raises(InvalidRequest) as info:
        responses.parse(raw)
    assert info.value.param == param
    assert words in info.value.message


def test_too_deep_a_body_is_refused() -> None:
    raw = b'{"input": [{"type": "unknown", "payload": ' + b"[" * 300 + b"]" * 300 + b"}]}"
    with pytest.raises(InvalidRequest, match="nested more than 250 levels"):
        responses.parse(raw)


def test_fields_read() -> None:
    conv = _parse(
        {
            "model": "m",
            "input": "hi",
            "stream": True,
            "max_output_tokens": 20,
            "safety_identifier": "u1",
            "instructions": "sys",
        }
    )
    assert (conv.endpoint, conv.model, conv.stream, conv.max_tokens, conv.user) == (
        "responses",
        "m",
        True,
        20,
        "u1",
    )
    assert (conv.items, conv.head, conv.tools, conv.n) == (["sys", "hi"], 1, None, 1)
    assert [r["role"] for r in conv.roles] == ["system", "user"]
    assert _parse({"input": "x", "user": "a", "safety_identifier": "b"}).user == "a"


def test_roles_keep_pairs_in_one_turn() -> None:
    conv = _parse(RESPONSES[3])  # user, call, user (while it runs), output, said, user, ...
    assert [r["role"] for r in conv.roles] == [
        "user",
        "assistant",
        "tool",  # between c1 and its output: opens no turn
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    head = _parse(RESPONSES[1])
    assert [r["role"] for r in head.roles][:3] == ["developer", "user", "assistant"]
    # The system message in the middle is no head: it stays in its turn.
    assert head.roles[13] == {"role": "assistant"}


def test_unknown_items_and_fields_pass_through() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": "a", "extra": {"k": [1, 2.5]}},
            {"type": "web_search_call", "id": "ws1", "status": "completed"},
            {"type": "item_reference", "id": "msg_1"},
            {"type": "computer_call", "call_id": "k1", "action": {}},
            {"role": "user", "content": "between"},
            {"type": "computer_call_output", "call_id": "k1", "output": {}},
            {"role": "user", "content": "b"},
        ],
        "vendor_field": {"x": None},
        "store": True,
    }
    conv = _parse(body)
    roles = [r["role"] for r in conv.roles]
    assert roles == ["user", "assistant", "assistant", "assistant", "tool", "tool", "user"]
    _chat, owner = responses.to_chat(conv, range(len(conv.items)))
    # vLLM refuses items it cannot convert; they add no message here.
    assert owner == [0, 4, 6]
    out = orjson.loads(responses.render(conv, range(len(conv.items)), None))
    assert out == body
    kept = orjson.loads(responses.render(conv, [6], 7, store=False))
    assert kept == {**body, "input": [body["input"][6]], "max_output_tokens": 7, "store": False}


def test_render_keeps_items_byte_identical_and_instructions_untouched() -> None:
    body = RESPONSES[1] | {"instructions": "Be brief.", "temperature": 0.25}
    conv = _parse(body)
    kept = [0, 1, 10, 11, 12, 13, 14, 15]
    out = orjson.loads(responses.render(conv, kept, None))
    assert out["instructions"] == "Be brief." and out["temperature"] == 0.25
    expected = [orjson.dumps(conv.items[i]) for i in kept[1:]]
    assert [orjson.dumps(item) for item in out["input"]] == expected
    assert "max_output_tokens" not in out and "store" not in out
    text = _parse(RESPONSES[0])
    assert orjson.loads(responses.render(text, [0, 1], 9))["input"] == "What is 2+2?"


def test_to_chat_merges_a_run_into_one_assistant_message() -> None:
    conv = _parse(RESPONSES[2])
    chat, owner = responses.to_chat(conv, range(len(conv.items)))
    call = {
        "id": "c1",
        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
        "type": "function",
    }
    assert chat[1:] == [
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two", "tool_calls": [call]},
        {"role": "assistant", "content": "after the call", "reasoning": "late thought"},
        {"role": "assistant", "reasoning": "second thought"},
        {"role": "tool", "content": "found", "tool_call_id": "c1"},
        chat[-1],
    ]
    assert owner == [0, 1, 2, 4, 6, 7, 8]
    # A kept subset converts on its own: without "two", the call makes its own message.
    alone, owner = responses.to_chat(conv, [3, 4])
    assert alone == [{"role": "assistant", "tool_calls": [call], "content": "after the call"}]
    assert owner == [3]


def test_to_chat_of_the_first_sample() -> None:
    conv = _parse(RESPONSES[0])
    chat, owner = responses.to_chat(conv, [0, 1])
    assert chat == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert owner == [0, 1]
    assert conv.tools is not None
    assert [t["function"]["name"] for t in conv.tools] == ["lookup", "shell", "fs__read"]
    assert conv.tools[0]["function"] == {
        "name": "lookup",
        "description": "Look it up.",
        "parameters": {"type": "object"},
        "strict": True,
    }
    assert _parse({"input": "x", "tools": [{"type": "web_search"}]}).tools == []


def test_to_chat_never_writes_into_the_clients_items() -> None:
    item = {"type": "message", "role": "assistant", "content": [], "tool_calls": [{"id": "z"}]}
    conv = _parse({"input": [{"role": "user", "content": "q"}, item, {**_CALL}]})
    before = orjson.dumps(conv.body)
    chat, _ = responses.to_chat(conv, [0, 1, 2])
    assert chat[1]["tool_calls"][-1]["id"] == "c9"
    assert orjson.dumps(conv.body) == before


_CALL = {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}


def test_with_input_rebuilds_the_view() -> None:
    conv = _parse({"model": "m", "input": "now", "previous_response_id": "resp_1"})
    stored = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    grown = responses.with_input(conv, [*stored, {"role": "user", "content": "now"}])
    assert [r["role"] for r in grown.roles] == ["user", "assistant", "user"]
    assert grown.body["previous_response_id"] == "resp_1"
    assert conv.body["input"] == "now"


def test_usage() -> None:
    answer = {"id": "r", "usage": {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}}
    assert upstream_prompt_tokens(orjson.dumps(answer), input_tokens) == 12
    assert upstream_prompt_tokens(b"not json", input_tokens) is None
    assert upstream_prompt_tokens(b'{"usage": {"input_tokens": "1"}}', input_tokens) is None
