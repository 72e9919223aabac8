"""Hand-written Responses and Messages bodies that exercise vLLM's conversion paths.

Shared by the unit tests and the comparison with vLLM's own code
(``test_vllm_reference.py``): every body here is one vLLM 0.32 accepts.
"""

from __future__ import annotations

from typing import Any

FN_TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


def _call(call_id: str, name: str = "lookup", **extra: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": '{"q": "x"}',
        **extra,
    }


def _output(call_id: str, output: Any = "found") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _said(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _thought(text: str, field: str = "content") -> dict[str, Any]:
    kind = "reasoning_text" if field == "content" else "summary_text"
    item: dict[str, Any] = {"type": "reasoning", "summary": []}
    item[field] = [{"type": kind, "text": text}]
    return item


RESPONSES: list[dict[str, Any]] = [
    {
        "model": "m",
        "instructions": "Be terse.",
        "input": "What is 2+2?",
        "tools": [
            {**FN_TOOL, "strict": True, "description": "Look it up."},
            {"type": "custom", "name": "shell", "description": "Run a command."},
            {
                "type": "namespace",
                "name": "fs",
                "description": "files",
                "tools": [{"type": "function", "name": "read", "parameters": None}],
            },
            {"type": "web_search"},
        ],
    },
    {
        "model": "m",
        "input": [
            {"type": "message", "role": "developer", "content": "Use tools."},
            _user("find x"),
            _thought("I should look it up."),
            _said("Looking."),
            _call("c1"),
            _call("c2", namespace="fs"),
            _output("c1"),
            _output("c2", [{"type": "input_text", "text": "listing"}]),
            {"role": "assistant", "content": "Found it."},
            _user("and y?"),
            _thought("summary only", field="summary"),
            {"type": "custom_tool_call", "call_id": "c3", "name": "shell", "input": "ls -l é"},
            {"type": "custom_tool_call_output", "call_id": "c3", "output": "a b"},
            {"type": "message", "role": "system", "content": "Mid-conversation system."},
            _user("thanks"),
        ],
        "tools": [FN_TOOL],
    },
    {
        "model": "m",
        "instructions": "",
        "input": [
            _user("a"),
            _said("one"),
            _said("two"),
            _call("c1"),
            _said("after the call"),
            _thought("late thought"),
            _thought("second thought"),
            _output("c1"),
            _user("b"),
        ],
    },
    {
        # A user message between a call and its output: it must not open a turn.
        "model": "m",
        "input": [
            _user("start"),
            _call("c1"),
            _user("while the tool runs"),
            _output("c1"),
            _said("done"),
            _user("next"),
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "p"}],
            },
            _user("last"),
        ],
    },
]


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _use(use_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": name, "input": {"q": "é", "n": 1.5}}


def _result(use_id: str, content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": content}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}

MESSAGES: list[dict[str, Any]] = [
    {
        "model": "m",
        "max_tokens": 64,
        "system": "You are helpful.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [_text("Let me look."), _use("t1"), _use("t2")]},
            {
                "role": "user",
                "content": [
                    _result("t1"),
                    _result("t2", [_text("line 1"), _text("line 2"), IMAGE]),
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    _text("Done."),
                ],
            },
            {"role": "user", "content": [_result("t3", None), _text("also this")]},
        ],
        "tools": [
            {"name": "lookup", "description": "Look up.", "input_schema": {"properties": {}}},
            {"name": "other", "input_schema": {"type": "object"}, "strict": True},
        ],
    },
    {
        "model": "m",
        "max_tokens": 64,
        "system": [
            _text("x-anthropic-billing-header: cc_version=1; cch=abc;"),
            _text("Part one. "),
            _text("Part two."),
        ],
        "messages": [
            {"role": "user", "content": [_text("look"), IMAGE, _text("")]},
            {"role": "assistant", "content": []},
            {"role": "user", "content": [_text("")]},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "zzz"},
                    _result("t9", [_text("inline")]),
                ],
            },
            {
                "role": "user",
                "content": [
                    _result("t9", [{"type": "tool_reference", "tool_name": "lookup"}]),
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                ],
            },
        ],
    },
    {
        "model": "m",
        "max_tokens": 64,
        "system": "Top.",
        "messages": [
            {"role": "system", "content": "Leading inline."},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "system", "content": [_text("Reminder.")]},
            {"role": "user", "content": "three"},
        ],
    },
    {
        "model": "m",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [_use("t1")]},
            {"role": "user", "content": [_result("t1")]},
            {
                "role": "system",
                "content": [
                    {
                        "type": "tool_addition",
                        "tool": {
                            "type": "tool_definition",
                            "definition": {"name": "late", "input_schema": {"type": "object"}},
                        },
                    },
                    {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "gone"}},
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "lazy"}},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ],
        "tools": [
            {"name": "gone", "input_schema": {"type": "object"}},
            {"name": "lazy", "input_schema": {"type": "object"}, "defer_loading": True},
        ],
    },
]
