"""Where each dialect keeps its tool outputs, and one cleared: only the output's content
changes, the ids and every other field and block stay, the client's object untouched."""

from __future__ import annotations

import copy
from typing import Any

from proxy.dialects.tool_outputs import CHAT, MESSAGES, RESPONSES
from proxy.ladder import placeholder


def test_chat_outputs_are_tool_messages() -> None:
    items: list[Any] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "out"}]},
    ]
    assert CHAT.find(items) == [2]
    before = copy.deepcopy(items[2])
    assert CHAT.clear(items[2], 40) == {"role": "tool", "tool_call_id": "c1",
                                        "content": placeholder(40)}  # fmt: skip
    assert items[2] == before


def test_responses_outputs_are_every_call_output() -> None:
    items: list[Any] = [
        "instructions",
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "x" * 100},
        {"type": "custom_tool_call_output", "call_id": "b", "output": "y"},
        {"type": "local_shell_call_output", "call_id": "c", "output": "z", "status": "done"},
        {"type": "message", "role": "user", "content": "hi"},
    ]
    assert RESPONSES.find(items) == [2, 3, 4]
    assert RESPONSES.clear(items[4], 9) == {"type": "local_shell_call_output", "call_id": "c",
                                            "output": placeholder(9), "status": "done"}  # fmt: skip


def test_messages_outputs_are_tool_results_text_and_images_alike() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="},
    }
    message: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a" * 300},
            {"type": "tool_result", "tool_use_id": "t2", "content": [image], "is_error": False},
            {"type": "text", "text": "and keep going"},
        ],
    }
    items: list[Any] = [{"role": "user", "content": "task"}, {"role": "assistant", "content": []},
                        message]  # fmt: skip
    assert MESSAGES.find(items) == [2]
    before = copy.deepcopy(message)
    cleared: Any = MESSAGES.clear(message, 100)
    assert message == before
    blocks = cleared["content"]
    assert [b.get("tool_use_id") for b in blocks] == ["t1", "t2", None]
    assert blocks[1]["is_error"] is False and blocks[2] == message["content"][2]
    held = [int(b["content"].split("held ")[1].split(" ")[0]) for b in blocks[:2]]
    assert sum(held) <= 100 and held[0] > held[1] > 0
    assert all("cleared by trimproxy" in b["content"] for b in blocks[:2])
