"""``proxy.ladder_step.cleared_counts``: each output's count once cleared is its count,
less its content counted as a bare message, plus its placeholder counted so
(docs/architecture.md §6, counting), whatever the outputs' counts and contents, one
output at a time or all together."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.tool_outputs import CHAT, MESSAGES, RESPONSES, ToolOutputs
from proxy.ladder_step import cleared_counts
from proxy.tokens import ApproxCounter
from proxy.types import Message
from proxy.upstream import Upstream
from tests.proxy.test_prepare import services, upstream

__all__ = ["upstream"]  # the fixture, used by name

# Counts of 1 to 5 digits: a placeholder's count depends on its number's digits.
PER = [7, 31, 420, 5_000, 61_000, 8, 999]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


async def _one_by_one(
    counter: ApproxCounter, kind: ToolOutputs, items: list[Any], outputs: list[int]
) -> list[int]:
    """The definition, one output and one count at a time."""
    out = []
    for i in outputs:
        before: list[Message] = [{"role": "tool", "content": _text(kind.content(items[i]))}]
        after: list[Message] = [{"role": "tool", "content": _text(kind.cleared(items[i], PER[i]))}]
        held = (await counter.count(before)).per_message[0]
        out.append(PER[i] - held + (await counter.count(after)).per_message[0])
    return out


def _chat() -> list[Any]:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ=="}}
    contents: list[Any] = ["short", "x" * 300, [{"type": "text", "text": "a 1 2 3"}, image],
                           "y 12345 " * 80, "z", "", "w" * 256]  # fmt: skip
    return [{"role": "tool", "tool_call_id": f"c{k}", "content": c} for k, c in enumerate(contents)]


def _responses() -> list[Any]:
    outputs: list[Any] = ["o" * 400, "short", [{"type": "input_text", "text": "t"}], "9" * 30,
                          "p", "q" * 260, "r"]  # fmt: skip
    return [{"type": "function_call_output", "call_id": f"c{k}", "output": o}
            for k, o in enumerate(outputs)]  # fmt: skip


def _messages() -> list[Any]:
    def result(k: int, content: Any) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": f"t{k}", "content": content}
        return {"role": "user", "content": [block, {"type": "text", "text": "go on"}]}

    return [result(k, "m" * (50 * k + 1)) for k in range(len(PER))]


async def test_every_output_counted_cleared_as_one_at_a_time(upstream: Upstream) -> None:
    for kind, items in ((CHAT, _chat()), (RESPONSES, _responses()), (MESSAGES, _messages())):
        counter = ApproxCounter()
        svc = services(upstream, counter)
        outputs = kind.find(items)
        assert outputs == list(range(len(PER)))
        got = await cleared_counts(svc, kind, items, outputs, PER, None)
        assert got == await _one_by_one(ApproxCounter(), kind, items, outputs)
        # A part: the same outputs' counts whatever else is counted with them.
        part = await cleared_counts(svc, kind, items, outputs[2:5], PER, None)
        assert part == got[2:5]
