"""Conversations for the session tests, and time that passes without sleeping."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.sessions.memory import MemoryStore
from proxy.sessions.store import SessionStore

Message = dict[str, Any]


class FakeClock:
    """A ``clock=`` for the memory store that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def later(store: SessionStore, seconds: float) -> None:
    """Let ``seconds`` pass for ``store``. The memory store's clock is moved (no sleep,
    its clock becomes a ``FakeClock`` if it was not one); Redis keeps its own time
    (``TIME``), so the Redis run of a test is that behaviour's real-time test."""
    if isinstance(store, MemoryStore):
        if not isinstance(store.clock, FakeClock):
            store.clock = FakeClock(store.clock())
        store.clock.now += seconds
    else:
        await asyncio.sleep(seconds)


def conversation(users: int, *, tag: str = "a", system: str = "Answer briefly.") -> list[Message]:
    """System prompt, then ``users`` user turns with an answer after all but the last.

    The first user message is the same for every ``tag`` (so the id-less fingerprint
    is shared); the later turns differ by ``tag``.
    """
    messages: list[Message] = [{"role": "system", "content": system}]
    for i in range(users):
        text = "Hello there." if i == 0 else f"{tag}: question {i}"
        messages.append({"role": "user", "content": text})
        if i < users - 1:
            messages.append({"role": "assistant", "content": f"{tag}: answer {i}"})
    return messages


def chat_body(users: int, *, tag: str = "a", **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": conversation(users, tag=tag),
        "max_tokens": 8,
        **extra,
    }


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text; 0 when the series is absent."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        found = dict(
            pair.split("=", 1) for pair in label_text.rstrip("}").split(",") if "=" in pair
        )
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0
