"""Conversations the hf backend renders at start-up to check its shortcuts against
``apply_chat_template``.

They cover what changes how a template renders or how text tokenizes: system
prompts, tool calls with string arguments, tool results, ``content: None``, content
parts, reasoning, CJK, emoji, whitespace at the edges, and text that spells a
special token.
"""

from __future__ import annotations

from typing import Any

CHECK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CHECK_CONVERSATIONS: list[list[dict[str, Any]]] = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "  spaces at the edges \n\n"},
    ],
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Part one."},
                {"type": "text", "text": "第二部分\uff0c中文\u3002"},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees 🌤"},
        {"role": "user", "content": "thanks <|im_start|> <s> [INST] not special?"},
    ],
    [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."},
        {"role": "user", "content": "And now?"},
    ],
]
