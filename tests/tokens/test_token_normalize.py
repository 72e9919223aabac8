"""Messages are rebuilt the way vLLM rebuilds them before rendering."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy.tokens.hf.normalize import detect_content_format, to_conversation
from tests.tokens.templates import TEMPLATES


def test_none_content_and_text_parts() -> None:
    conv, media = to_conversation(
        [
            {"role": "assistant", "content": None},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    "b",
                    {"type": "image_url", "image_url": {"url": "u"}},
                    {"type": "text", "text": "c"},
                ],
            },
        ],
        "string",
    )
    assert conv == [{"role": "assistant", "content": ""}, {"role": "user", "content": "a\nb\nc"}]
    assert media == [0, 1]


def test_openai_format_keeps_typed_parts_but_tool_text_is_joined() -> None:
    conv, _ = to_conversation(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "t",
                "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}],
            },
        ],
        "openai",
    )
    assert conv[0]["content"] == [{"type": "text", "text": "hi"}]
    assert conv[1]["content"] == [{"type": "text", "text": "x"}, {"type": "image"}]
    assert conv[2] == {"role": "tool", "content": "1\n2", "tool_call_id": "t"}


def test_tool_call_arguments_are_parsed_and_the_request_is_untouched() -> None:
    calls: list[dict[str, Any]] = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": [1, 2]}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "c", "type": "function", "function": {"name": "h", "arguments": None}},
    ]
    message = {"role": "assistant", "content": "ok", "tool_calls": calls, "extra": 1}
    conv, _ = to_conversation([message], "string")
    tool_calls: list[dict[str, Any]] = conv[0]["tool_calls"]
    args = [c["function"]["arguments"] for c in tool_calls]
    assert args == [{"x": [1, 2]}, {}, {}]
    assert "extra" not in conv[0]  # fields vLLM drops are dropped
    assert calls[0]["function"]["arguments"] == '{"x": [1, 2]}'


def test_empty_tool_calls_and_reasoning() -> None:
    conv, _ = to_conversation(
        [{"role": "assistant", "content": "a", "tool_calls": [], "reasoning": "r", "name": "bot"}],
        "string",
    )
    assert conv == [
        {
            "role": "assistant",
            "content": "a",
            "reasoning": "r",
            "reasoning_content": "r",
            "name": "bot",
        }
    ]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "as it is"},
        {"content": "content first", "role": "user"},  # a template may read keys in order
        {"role": "developer", "content": "gets a tools key"},
        {"role": "user", "content": None},
        {"role": "user", "name": "no content"},
    ],
)
def test_a_role_and_a_string_go_on_as_they_are(message: dict[str, Any]) -> None:
    # The shortcut hands on the request's own dict; everything else is rebuilt. Either
    # way the template sees what vLLM's rebuild gives: the role and the text, in order.
    conv, media = to_conversation([message], "string")
    shortcut = (
        list(message) == ["role", "content"]
        and isinstance(message["content"], str)
        and message["role"] != "developer"
    )
    assert (conv[0] is message) is shortcut
    assert list(conv[0])[:2] == ["role", "content"]
    assert conv[0]["content"] == (message.get("content") or "")
    assert media == [0]
    parts, _ = to_conversation([message], "openai")
    assert parts[0] is not message  # the openai format wraps a string in a part


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("content_parts", "openai"),
        ("tools_default_system", "string"),
        ("think_strip", "string"),
        ("sliced_system", "string"),
    ],
)
def test_content_format_is_read_from_the_template(name: str, fmt: str) -> None:
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    assert detect_content_format(TEMPLATES[name], env) == fmt


def test_content_format_follows_aliases() -> None:
    env = ImmutableSandboxedEnvironment()
    template = (
        "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}"
        "{% for c in m['content'] | list %}{{ c.text }}{% endfor %}{% endfor %}"
    )
    assert detect_content_format(template, env) == "openai"
    assert detect_content_format("{% for", env) == "string"
