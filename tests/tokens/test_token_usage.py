"""estimate_error reads the prompt tokens of a response body's usage, in every dialect."""

from __future__ import annotations

import json

import orjson

from proxy.tokens import estimate_error
from proxy.tokens.usage import anthropic_input_tokens, input_tokens, upstream_prompt_tokens


def body(content: str, usage: object = None) -> bytes:
    data: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if usage is not None:
        data["usage"] = usage
    return orjson.dumps(data)


def test_difference_is_ours_minus_upstreams() -> None:
    b = body("hi", {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123})
    assert estimate_error(125, b) == 5
    assert estimate_error(100, b) == -20


def test_no_usage_or_not_json() -> None:
    assert estimate_error(10, body("hi")) is None
    assert estimate_error(10, b"<html>bad gateway</html>") is None
    assert estimate_error(10, body("hi", {"prompt_tokens": "12"})) is None


def test_large_bodies_use_the_tail_and_ignore_quoted_text() -> None:
    trap = 'the text says "prompt_tokens": 999 and more ' * 500  # escaped inside JSON
    b = body(
        trap,
        {"prompt_tokens": 7, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}},
    )
    assert len(b) > 4096
    assert upstream_prompt_tokens(b) == 7
    assert upstream_prompt_tokens(body(trap)) is None


def test_the_dialects_usage_is_read_too() -> None:
    responses = {"input_tokens": 40, "output_tokens": 3, "total_tokens": 43}
    answer = orjson.dumps({"object": "response", "usage": responses})
    assert upstream_prompt_tokens(answer, input_tokens) == 40
    assert upstream_prompt_tokens(answer) is None  # chat's reader reads chat's field
    # Anthropic's input_tokens leave out what the prompt cache read or wrote.
    anthropic = {
        "input_tokens": 10,
        "cache_read_input_tokens": 32,
        "cache_creation_input_tokens": None,
        "output_tokens": 5,
    }
    message = orjson.dumps({"type": "message", "usage": anthropic})
    assert upstream_prompt_tokens(message, anthropic_input_tokens) == 42
    wrong = orjson.dumps({"usage": {"input_tokens": "10"}})
    assert upstream_prompt_tokens(wrong, anthropic_input_tokens) is None


def test_a_responses_usage_is_read_where_the_usage_opens() -> None:
    trap = 'it said "usage": {"input_tokens": 999} ' * 3  # escaped inside JSON
    text = {"type": "output_text", "text": trap, "annotations": []}
    answer: dict[str, object] = {
        "id": "resp_1",
        "output": [{"type": "message", "role": "assistant", "content": [text]}],
        "usage": {"input_tokens": 40, "output_tokens": 3, "total_tokens": 43},
        "user": None,
    }
    assert upstream_prompt_tokens(orjson.dumps(answer), input_tokens) == 40
    spaced = json.dumps(answer, indent=1).encode()  # blanks and newlines between tokens
    assert upstream_prompt_tokens(spaced, input_tokens) == 40
    # A usage that does not open with input_tokens is read by parsing the answer.
    answer["usage"] = {"output_tokens": 3, "input_tokens": 41}
    assert upstream_prompt_tokens(orjson.dumps(answer), input_tokens) == 41
    answer["usage"] = {"output_tokens": 3}
    assert upstream_prompt_tokens(orjson.dumps(answer), input_tokens) is None
