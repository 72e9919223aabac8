"""Tool-call turns (assistant ``content: null`` with ``tool_calls``, then ``tool``
results) are placed in the plain render, and split exactly as the tracked render
splits them, on the tiny templates that render tool calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.tokens.hf import HFCounter
from proxy.tokens.hf.self_check import CHECK_TOOLS as TOOLS

AGENT: list[dict[str, Any]] = [
    {"role": "system", "content": "You call tools."},
    {"role": "user", "content": "What is the weather in Paris and in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"word": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"word": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
    {"role": "tool", "tool_call_id": "call_2", "content": "cloudy, 17 degrees"},
    {"role": "assistant", "content": "Paris is sunny; Rome is cloudy."},
    {"role": "user", "content": "And tomorrow?"},
]
#: One call, one result: what every template here writes with a header per message.
#: (Parallel results may share one header, as in Qwen's templates: such a request
#: is not placed, and is rendered tracked.)
SINGLE: list[dict[str, Any]] = [*AGENT[:2], {**AGENT[2], "tool_calls": AGENT[2]["tool_calls"][:1]},
                                AGENT[3], *AGENT[5:]]  # fmt: skip


@pytest.mark.parametrize("name", ["tools_default_system", "sliced_system"])
def test_a_tool_call_turn_is_placed_as_tracking_places_it(
    name: str, template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    path = template_dir(name)
    tok = hf_counter(path)._tok
    located, tracked_only = HFCounter(tok, str(path)), HFCounter(tok, str(path))
    for counter in (located, tracked_only):
        counter.self_check()
    for template in tracked_only._templates.values():
        for locator in template.locators:
            locator.refuted = True
    for tools in (None, TOOLS):
        locator = located._template(tools).locators[tools is not None]
        if not locator.usable:
            continue
        assert locator.contentless is True, (name, tools)
        before = locator.placed
        got = asyncio.run(located.count(SINGLE, tools=tools))
        if name == "sliced_system":  # a header per message: placed, not rendered tracked
            assert locator.placed == before + 1
        assert got == asyncio.run(tracked_only.count(SINGLE, tools=tools))
        # Placed or not, parallel calls split as the tracked render splits them.
        got = asyncio.run(located.count(AGENT, tools=tools))
        assert got == asyncio.run(tracked_only.count(AGENT, tools=tools))
    for counter in (located, tracked_only):
        asyncio.run(counter.aclose())
