"""Anthropic context editing in front of a real vLLM engine, through the official
``anthropic`` SDK's beta client (docs/dialects.md, "Context editing").

Each documented parameter changes what the engine gets as Anthropic says it does: the
engine's own ``usage`` for the request through the proxy equals its ``usage`` for the
edited prompt written out by hand and sent to it directly, and the answer's
``applied_edits`` says what was cleared, ``cleared_input_tokens`` the engine's tokens
saved. The engine is ``tests.support.agent_engine``'s (a template that renders tools
and tool messages, auto tool choice on), as for ``test_agent_vllm.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from proxy.dialects.context_editing import PLACEHOLDER
from tests.support.agent_engine import AgentProxies
from tests.support.closing import Closing
from tests.support.dialect_clients import MAX_TOKENS, anthropic_input, prose
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

BETA = "context-management-2025-06-27"
ROUNDS = 10
SYSTEM = "You work through the task with the tools."
TOOLS: list[Any] = [
    {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for name in ("read_file", "memory")
]


@pytest.fixture
def engine(agent_engine: VllmStack) -> VllmStack:
    """The shared tool-rendering engine (window 8,192; tests/e2e/conftest.py)."""
    return agent_engine


@pytest.fixture
def proxy(engine: VllmStack) -> Iterator[ProxyProcess]:
    proxies = AgentProxies(engine)
    yield proxies.start()
    proxies.stop_all()


def task() -> list[Any]:
    """A task and ``ROUNDS`` tool rounds, each call's thinking before it; every fifth
    call is to ``memory``."""
    out: list[Any] = [{"role": "user", "content": f"Fix the failing test. {prose(1, 20)}"}]
    for i in range(ROUNDS):
        name = "memory" if i % 5 == 0 else "read_file"
        think = {"type": "thinking", "thinking": prose(50 + i, 12), "signature": "sig"}
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"path": f"f{i}"}}
        out.append({"role": "assistant", "content": [think, call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": prose(i, 60)}
        out.append({"role": "user", "content": [result]})
    return out


def by_hand(cleared: set[int], *, inputs: bool = False) -> list[Any]:
    """The task with the results (and with ``inputs`` the calls' input) of the tool
    uses in ``cleared`` replaced as Anthropic documents it."""
    out = task()
    for i in cleared:
        call = out[1 + 2 * i]["content"][1]
        if inputs:
            call["input"] = {}
        out[2 + 2 * i]["content"][0]["content"] = PLACEHOLDER
    return out


def direct(engine: VllmStack, messages: list[Any]) -> int:
    """The engine's prompt tokens for ``messages``, asked without the proxy."""
    body = {
        "model": MODEL_NAME, "system": SYSTEM, "messages": messages, "tools": TOOLS,
        "max_tokens": MAX_TOKENS,
    }  # fmt: skip
    answer = httpx.post(
        f"{engine.api_base}/messages", json=body, headers=engine.headers(), timeout=120
    )
    assert answer.status_code == 200, answer.text
    return anthropic_input(anthropic.types.Usage.model_validate(answer.json()["usage"]))


Send = Callable[..., tuple[int, list[Any]]]


@pytest.fixture
def send(closing: Closing, proxy: ProxyProcess) -> Send:
    client = closing(anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0))

    def send(*edits: Any, stream: bool = False) -> tuple[int, list[Any]]:
        """The engine's prompt tokens through the proxy, and the answer's applied edits."""
        args: Any = {
            "model": MODEL_NAME, "system": SYSTEM, "messages": task(), "tools": TOOLS,
            "max_tokens": MAX_TOKENS, "betas": [BETA],
            "context_management": {"edits": list(edits)},
        }  # fmt: skip
        if stream:
            with client.beta.messages.stream(**args) as streamed:
                message = streamed.get_final_message()
        else:
            message = client.beta.messages.create(**args)
        assert message.context_management is not None
        applied = [e.model_dump() for e in message.context_management.applied_edits]
        return anthropic_input(message.usage), applied

    return send


def tool_edit(**fields: Any) -> Any:
    return {"type": "clear_tool_uses_20250919", **fields}


def uses(value: int) -> Any:
    return {"type": "tool_uses", "value": value}


LOW = {"type": "input_tokens", "value": 100}
OLD = set(range(ROUNDS - 3))  # all but the default keep of 3


def test_each_parameter_changes_what_the_engine_gets(engine: VllmStack, send: Send) -> None:
    whole = direct(engine, task())
    cases: list[tuple[str, Any, set[int], bool]] = [
        ("default trigger: 100k not reached", tool_edit(), set(), False),
        ("trigger in input tokens, keep 3", tool_edit(trigger=LOW), OLD, False),
        ("trigger: 10 tool uses not exceeded", tool_edit(trigger=uses(10)), set(), False),
        ("trigger: 9 tool uses exceeded", tool_edit(trigger=uses(9)), OLD, False),
        ("keep 6", tool_edit(trigger=LOW, keep=uses(6)), set(range(4)), False),
        ("exclude memory", tool_edit(trigger=LOW, exclude_tools=["memory"]), OLD - {0, 5}, False),
        ("clear_tool_inputs", tool_edit(trigger=LOW, clear_tool_inputs=True), OLD, True),
        ("clear_tool_inputs named", tool_edit(trigger=LOW, clear_tool_inputs=["read_file"]),
         OLD, True),
    ]  # fmt: skip
    report = []
    for name, edit, cleared, inputs in cases:
        got, applied = send(edit)
        want = by_hand(cleared, inputs=inputs)
        if name == "clear_tool_inputs named":  # the memory calls keep their input
            for i in (0, 5):
                want[1 + 2 * i]["content"][1]["input"] = {"path": f"f{i}"}
        assert got == direct(engine, want), name
        if cleared:
            assert applied == [
                {"type": "clear_tool_uses_20250919", "cleared_tool_uses": len(cleared),
                 "cleared_input_tokens": whole - got},
            ], name  # fmt: skip
            assert got < whole, name
        else:
            assert (applied, got) == ([], whole), name
        report.append(f"{name}: {whole} -> {got}")
    # clear_at_least: what keep 3 would clear is not enough, so nothing is.
    freed = whole - send(tool_edit(trigger=LOW))[0]
    at_least = {"type": "input_tokens", "value": freed + 1}
    assert send(tool_edit(trigger=LOW, clear_at_least=at_least)) == (whole, [])
    at_least["value"] = freed
    assert send(tool_edit(trigger=LOW, clear_at_least=at_least))[0] == whole - freed
    print("\ncontext editing on vLLM (engine's prompt tokens):\n  " + "\n  ".join(report))


def test_thinking_and_tool_clearing_together_and_streamed(
    engine: VllmStack, proxy: ProxyProcess, send: Send
) -> None:
    whole = direct(engine, task())
    thinking = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    got, applied = send(thinking, tool_edit(trigger=LOW), stream=True)
    # One user turn: the whole tool loop is one assistant turn, so there is no older
    # thinking to clear; the tools' results go as with keep 3.
    assert got == direct(engine, by_hand(OLD))
    assert [a["type"] for a in applied] == ["clear_tool_uses_20250919"]
    assert applied[0]["cleared_input_tokens"] == whole - got
    # The same task in three user turns: the thinking of the first two goes.
    rounds = task()
    turns = [
        *rounds[:7], {"role": "assistant", "content": "Three files read."},
        {"role": "user", "content": "Go on."},
        *rounds[7:13], {"role": "assistant", "content": "Three more."},
        {"role": "user", "content": "Go on."},
        *rounds[13:],
    ]  # fmt: skip
    last_turn = len(rounds[:13]) + 4
    edited = [
        {**m, "content": [b for b in m["content"] if b["type"] != "thinking"]}
        if i < last_turn and m["role"] == "assistant" and isinstance(m["content"], list)
        else m
        for i, m in enumerate(turns)
    ]
    body: Any = {
        "model": MODEL_NAME, "system": SYSTEM, "messages": turns, "tools": TOOLS,
        "max_tokens": MAX_TOKENS, "context_management": {"edits": [thinking]},
    }  # fmt: skip
    reply = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=120).json()
    (entry,) = reply["context_management"]["applied_edits"]
    assert entry["type"] == "clear_thinking_20251015" and entry["cleared_thinking_turns"] == 2
    engine_count = anthropic_input(anthropic.types.Usage.model_validate(reply["usage"]))
    assert engine_count == direct(engine, edited)
    assert entry["cleared_input_tokens"] == direct(engine, turns) - engine_count
    print(f"\nthinking cleared from 2 of 3 turns: {entry['cleared_input_tokens']} tokens")
