"""Conversations for the counter tests: hand-written traps and a hypothesis strategy."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]

_TEXT = st.sampled_from(
    [
        "hello",
        "How are you today?",
        "  padded  ",
        "line one\nline two\n\n",
        "",
        "数字和中文混合 123",
        "emoji 🎉🎉",
        "<|im_start|> spelled out",
        "tab\tand\r\nnewline",
        "x" * 300,
        "The proxy keeps every chat prompt inside a token budget. " * 20,
    ]
) | st.text(min_size=0, max_size=60)


def _call(i: int, args: str) -> dict[str, Any]:
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "lookup", "arguments": args},
    }


@st.composite
def conversations(draw: st.DrawFn, *, tools: bool = True, parts: bool = True) -> list[Any]:
    """system? then turns of user, assistant (maybe tool calls + tool results)."""
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(_TEXT)})
    for i in range(draw(st.integers(1, 5))):
        if parts and draw(st.booleans()):
            n = draw(st.integers(1, 3))
            content: Any = [{"type": "text", "text": draw(_TEXT)} for _ in range(n)]
        else:
            content = draw(_TEXT)
        out.append({"role": "user", "content": content})
        if tools and draw(st.booleans()):
            args = draw(
                st.sampled_from(['{"word": "apple"}', '{"word": "\\u4e2d"}', "not json", ""])
            )
            out.append(
                {
                    "role": "assistant",
                    "content": draw(st.none() | _TEXT),
                    "tool_calls": [_call(i, args)],
                }
            )
            out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": draw(_TEXT)})
        reply = draw(_TEXT)
        if draw(st.booleans()):
            reply = "<think>\n" + draw(_TEXT) + "\n</think>\n\n" + reply
        out.append({"role": "assistant", "content": reply})
    out.append({"role": "user", "content": draw(_TEXT)})
    return out


def growing_chat(turns: int, words: int = 120) -> list[dict[str, Any]]:
    """A deterministic long chat: system, then user/assistant pairs of prose."""
    sentence = (
        "The quick brown fox jumps over the lazy dog while the proxy counts "
        "every token of the prompt exactly once. "
    )
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: " + sentence * (words // 20)})
        out.append({"role": "assistant", "content": f"Answer {i}. " + sentence * (words // 10)})
    return out
