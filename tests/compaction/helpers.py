"""An agent's Responses conversation with tool rounds, as the openai SDK sends one,
and what the engine got."""

from __future__ import annotations

from typing import Any

import orjson

from tests.support.sim import SimUpstream

TASK = "Fix the failing test in tests/test_app.py."


def tool_round(n: int, size: int = 400) -> list[dict[str, Any]]:
    """One call and its output, the output ``size`` characters long."""
    call = f"call_{n}"
    return [
        {"type": "function_call", "call_id": call, "name": "shell", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": call, "output": f"out{n} " + "x" * size},
    ]


def agent_input(rounds: int, size: int = 400) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "Work in /repo."},
        {"type": "message", "role": "user", "content": TASK},
    ]
    for n in range(rounds):
        items.extend(tool_round(n, size))
    return items


def sent_bodies(sim: SimUpstream) -> list[dict[str, Any]]:
    return [orjson.loads(r["body"]) for r in sim.requests("/v1/responses")]


def types_of(items: list[Any]) -> list[str]:
    return [str(item.get("type", "message")) for item in items]


def compaction_items(body: dict[str, Any]) -> list[Any]:
    return [
        i
        for i in body.get("input", [])
        if isinstance(i, dict) and "compaction" in str(i.get("type"))
    ]


def dumped(output: Any) -> list[dict[str, Any]]:
    """The SDK's output items as the JSON they came as."""
    return [i.model_dump(mode="json", exclude_none=True, warnings=False) for i in output]
