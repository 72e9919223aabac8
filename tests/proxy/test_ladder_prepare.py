"""The trim ladder in the chat route's prepare step: the cleared body, the response
header, the counters and the access-log field; ``TRIMPROXY_CLEAR_TOOL_OUTPUTS=off``
keeps the whole-turn trim alone (and refuses an agent's one-turn task)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.dialects import tool_outputs
from proxy.dialects.chat import parse_chat
from proxy.errors import ContextLengthExceeded
from proxy.ladder_step import CLEARED_TOOL_OUTPUTS, may_clear
from proxy.tokens import ApproxCounter
from proxy.upstream import Upstream
from tests.proxy.test_prepare import run, sample, services, upstream

__all__ = ["upstream"]  # the fixture, used by name


def task(rounds: int, words: int = 600) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be an agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for k in range(rounds):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = f"{k} " + "out " * words
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": text})
    return messages


async def test_old_outputs_are_cleared_and_told(upstream: Upstream) -> None:
    svc = services(upstream, ApproxCounter(), context_window=4096)
    messages = task(20)
    prepared, facts, _ = await run(svc, messages, max_tokens=16)
    sent = orjson.loads(prepared.body)["messages"]
    cleared = int(prepared.headers[CLEARED_TOOL_OUTPUTS])
    assert cleared > 0 and prepared.dropped == 0
    assert len(sent) == len(messages)
    assert [m.get("tool_calls") for m in sent] == [m.get("tool_calls") for m in messages]
    assert [m.get("tool_call_id") for m in sent] == [m.get("tool_call_id") for m in messages]
    assert sum("cleared by trimproxy" in str(m["content"]) for m in sent) == cleared
    assert sent[-3:] == messages[-3:]  # the latest three whole
    assert prepared.forwarded_tokens <= (prepared.budget or 0) < prepared.received_tokens
    assert facts.tool_outputs_cleared == cleared
    assert facts.fields("POST", "/v1/chat/completions", 200, 0.1)["tool_outputs_cleared"] == cleared
    assert sample(svc, "trimproxy_cleared_tool_outputs_total", {"endpoint": "chat"}) == cleared
    freed = sample(svc, "trimproxy_cleared_tool_output_tokens_total", {"endpoint": "chat"})
    assert freed == prepared.received_tokens - prepared.forwarded_tokens


async def test_latest_outputs_that_do_not_fit_whole_are_cleared_but_the_newest(
    upstream: Upstream,
) -> None:
    svc = services(upstream, ApproxCounter(), context_window=4096)
    messages = task(20, words=1500)  # three outputs alone are over the budget
    prepared, _, _ = await run(svc, messages, max_tokens=16)
    sent = orjson.loads(prepared.body)["messages"]
    tools = [m for m in sent if m["role"] == "tool"]
    assert tools[-1] == messages[-1] and tools[-2] == messages[-3]  # two fit whole
    assert "cleared by trimproxy" in tools[-3]["content"]  # the third did not
    assert sent[1] == messages[1] and prepared.dropped > 0  # the task kept, old rounds gone
    assert prepared.forwarded_tokens <= (prepared.budget or 0)


async def test_off_keeps_the_whole_turn_trim_alone(upstream: Upstream) -> None:
    svc = services(upstream, ApproxCounter(), context_window=4096, clear_tool_outputs="off")
    with pytest.raises(ContextLengthExceeded):
        await run(svc, task(20), max_tokens=16)


def test_may_clear_asks_for_a_tool_output_before_the_ladder(upstream: Upstream) -> None:
    """Chat's question is answered from the roles: a prompt with no ``tool`` message
    never enters the ladder, one with a tool output does, and the setting turns it off;
    a dialect whose outputs are not roles (Responses) always asks the ladder."""
    svc = services(upstream, ApproxCounter())
    off = services(upstream, ApproxCounter(), clear_tool_outputs="off")
    plain = parse_chat(orjson.dumps({"model": "m", "messages": task(0)}))
    agent = parse_chat(orjson.dumps({"model": "m", "messages": task(2)}))
    assert (plain.holds_tool_role, agent.holds_tool_role) == (False, True)  # the parse's
    assert not may_clear(svc, tool_outputs.CHAT, plain)
    assert may_clear(svc, tool_outputs.CHAT, agent)
    # Where the parse did not tell, the roles are read.
    assert may_clear(svc, tool_outputs.CHAT, replace(agent, holds_tool_role=None))
    assert not may_clear(svc, tool_outputs.CHAT, replace(plain, holds_tool_role=None))
    assert not may_clear(off, tool_outputs.CHAT, agent)
    assert not may_clear(svc, None, agent)
    assert may_clear(svc, tool_outputs.RESPONSES, plain)
