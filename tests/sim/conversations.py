"""Multi-turn conversations driven through trimproxy, the way the prefix-cache tests
(sim and real vLLM) run them: deterministic text, every answer appended as the
client got it, turns of several conversations interleaved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

SYSTEM = "You are a careful assistant. Answer in one short paragraph."


def question(conversation: int, turn: int, words: int) -> str:
    # Words differ per conversation and turn, so no two prompts share text by chance.
    return " ".join(f"c{conversation}t{turn}w{j}" for j in range(words))


class Conversation:
    def __init__(self, index: int, words: int = 40) -> None:
        self.index = index
        self.words = words
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]

    async def turn(self, client: httpx.AsyncClient, turn: int, **body: Any) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": question(self.index, turn, self.words)})
        response = await client.post(
            "/v1/chat/completions",
            json={"model": body.pop("model", "sim-model"), "messages": self.messages, **body},
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        self.messages.append(
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
        )
        return answer


async def run_interleaved(
    clients: list[httpx.AsyncClient],
    pick: Callable[[int, int], int],
    conversations: int,
    turns: int,
    **body: Any,
) -> None:
    """Turn 0 of every conversation, then turn 1 of each, ...; ``pick(conversation,
    turn)`` says which client (engine) gets that request."""
    talks = [Conversation(c) for c in range(conversations)]
    for turn in range(turns):
        for talk in talks:
            await talk.turn(clients[pick(talk.index, turn)], turn, **dict(body))
