"""The completions dialect, and Anthropic's error envelope."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects import anthropic_errors, completions
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest
from proxy.tokens.usage import prompt_tokens, upstream_prompt_tokens


def _parse(body: dict[str, Any]) -> Conversation:
    return completions.parse(orjson.dumps(body))


@pytest.mark.parametrize(
    ("prompt", "texts", "lengths", "count"),
    [
        ("once upon", ["once upon"], None, 1),
        (["a", "b"], ["a", "b"], None, 2),
        ([1, 2, 3], None, [3], 1),
        ([[1, 2], [3]], None, [2, 1], 2),
        ([], None, [0], 1),
    ],
)
def test_prompt_forms(prompt: Any, texts: Any, lengths: Any, count: int) -> None:
    conv = _parse({"model": "m", "prompt": prompt, "n": 2})
    assert completions.prompt_text(conv) == texts
    assert completions.prompt_ids_lengths(conv) == lengths
    assert completions.prompt_count(conv) == count
    assert (conv.items, conv.roles, conv.head, conv.n, conv.tools) == ([], [], 0, 2, None)
    assert completions.to_chat(conv, []) == ([], [])


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "m"}, "prompt", "'prompt' is required"),
        ({"prompt": 5}, "prompt", "a list of token ids"),
        ({"prompt": [1, "a"]}, "prompt", "token-id lists"),
        ({"prompt": [True]}, "prompt", "token ids"),
        ({"prompt": [-1]}, "prompt", "token ids"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "positive integer"),
        ({"prompt": "x", "echo": 1}, "echo", "true or false"),
    ],
)
def test_parse_errors(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _parse(body)
    assert info.value.param == param
    assert words in info.value.message


def test_fields_and_render() -> None:
    body = {"model": "m", "prompt": "p", "stream": True, "user": "u", "best_of": 3, "x": [1.5]}
    conv = _parse(body)
    # vLLM's default when max_tokens is absent; null leaves the answer unbounded.
    assert (conv.model, conv.stream, conv.user, conv.max_tokens) == ("m", True, "u", 16)
    assert _parse({"prompt": "p", "max_tokens": None}).max_tokens is None
    assert orjson.loads(completions.render(conv, [], None)) == body
    assert orjson.loads(completions.render(conv, [], 5)) == {**body, "max_tokens": 5}
    scored = _parse({"prompt": "p", "echo": True, "max_tokens": 0})
    assert scored.body["echo"] is True and scored.max_tokens == 1
    assert completions.special_tokens(conv)
    assert not completions.special_tokens(_parse({"prompt": "p", "add_special_tokens": False}))
    assert completions.truncation({"truncate_prompt_tokens": 7}) == 7
    assert completions.truncation({"truncate_prompt_tokens": -1}) is None


def test_usage() -> None:
    answer = {"usage": {"prompt_tokens": 4, "completion_tokens": 16, "total_tokens": 20}}
    assert upstream_prompt_tokens(orjson.dumps(answer), prompt_tokens) == 4
    assert upstream_prompt_tokens(b'{"usage": null}', prompt_tokens) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_anthropic_envelope(status: int, kind: str) -> None:
    body = orjson.loads(anthropic_errors.envelope(status, "why"))
    assert body == {"type": "error", "error": {"type": kind, "message": "why"}}


def test_too_long_message_is_worded_as_anthropic_words_it() -> None:
    text = anthropic_errors.too_long_message(208310, 200000)
    assert text == "prompt is too long: 208310 tokens > 200000 maximum"
