"""A ``previous_response_id`` chain driven by the official ``openai`` SDK, each turn
sending only its new input, and what the engine was sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import openai
import orjson
from openai.types.responses import ResponseCompletedEvent

from proxy.pipeline.prepare import PROMPT_TOKENS
from tests.support.sim import SimUpstream

INSTRUCTIONS = "You are terse."


def words(turn: int, tag: str = "a") -> str:
    return f"{tag} turn {turn}: " + " ".join(f"word{turn}x{i}" for i in range(30))


@dataclass
class Turn:
    response: dict[str, Any]
    """The response object as the client got it."""
    forwarded: int
    """X-Trimproxy-Prompt-Tokens."""
    session: str | None


def turn(
    client: openai.OpenAI,
    n: int,
    previous: str | None,
    *,
    stream: bool,
    tag: str = "a",
    max_output_tokens: int = 16,
    model: str = "sim-model",
) -> Turn:
    """One turn of a chain: its own input only, continuing ``previous``."""
    extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
    raw = client.responses.with_raw_response.create(
        model=model,
        instructions=INSTRUCTIONS,
        input=[{"role": "user", "content": words(n, tag)}],
        max_output_tokens=max_output_tokens,
        stream=stream,
        **extra,
    )
    forwarded = int(raw.headers[PROMPT_TOKENS])
    session = raw.headers.get("x-trimproxy-session-id")
    if not stream:
        return Turn(orjson.loads(raw.http_response.content), forwarded, session)
    completed = [e for e in raw.parse() if isinstance(e, ResponseCompletedEvent)]
    assert len(completed) == 1
    return Turn(completed[0].response.model_dump(mode="json"), forwarded, session)


def sent_bodies(sim: SimUpstream) -> list[dict[str, Any]]:
    """The Responses bodies the engine got, oldest first."""
    return [orjson.loads(r["body"]) for r in sim.requests("/v1/responses")]


def texts(items: list[Any]) -> list[str]:
    """The text of each message item (user input and assistant output alike)."""
    out = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.append("".join(part.get("text", "") for part in content))
    return out
