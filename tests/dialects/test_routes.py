"""The Responses and Messages routes through a real proxy in front of the simulated
vLLM engine, driven by the official SDKs: a conversation past the budget is trimmed on
every turn, the count equals the engine's ``input_tokens``, and a prompt that cannot
fit is refused in the dialect's own envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from proxy.app import create_app
from proxy.metrics import Metrics
from tests.support.closing import AsyncClosing
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream

BUDGET = 300
TURNS = 12


@pytest.fixture
async def proxy_url(sim: SimUpstream) -> AsyncIterator[str]:
    settings = make_settings(
        sim.url, tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0
    )
    async with served(create_app(settings, Metrics())) as url:
        yield url


def words(turn: int) -> str:
    return f"Turn {turn}: " + " ".join(f"word{turn}x{i}" for i in range(30))


async def test_a_responses_conversation_stays_within_the_budget(
    aclosing: AsyncClosing, proxy_url: str, sim: SimUpstream
) -> None:
    client = await aclosing(openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused"))
    history: list[Any] = []
    dropped = []
    for turn in range(TURNS):
        history.append({"role": "user", "content": words(turn)})
        raw = await client.responses.with_raw_response.create(
            model="sim-model",
            instructions="You are terse.",
            input=history,
            store=False,
            max_output_tokens=16,
        )
        response = raw.parse()
        forwarded = int(raw.headers["x-trimproxy-prompt-tokens"])
        assert forwarded <= BUDGET
        assert response.usage is not None
        assert response.usage.input_tokens == forwarded  # the count is the engine's
        dropped.append(int(raw.headers["x-trimproxy-trimmed-messages"]))
        history.append({"role": "assistant", "content": response.output_text})
    assert dropped[0] == 0 and max(dropped) > 0, dropped
    sent = orjson.loads(sim.requests("/v1/responses")[-1]["body"])
    assert sent["instructions"] == "You are terse."  # the head is kept
    assert sent["input"][0]["role"] == "user"  # whole turns dropped
    assert sent["input"][-1] == history[-2]  # the last turn kept as the client sent it


async def test_a_messages_conversation_stays_within_the_budget(
    aclosing: AsyncClosing, proxy_url: str, sim: SimUpstream
) -> None:
    client = await aclosing(anthropic.AsyncAnthropic(base_url=proxy_url, api_key="unused"))
    history: list[Any] = []
    dropped = []
    for turn in range(TURNS):
        history.append({"role": "user", "content": words(turn)})
        raw = await client.messages.with_raw_response.create(
            model="sim-model", system="You are terse.", messages=history, max_tokens=16
        )
        message = await raw.parse()
        forwarded = int(raw.headers["x-trimproxy-prompt-tokens"])
        assert forwarded <= BUDGET
        assert message.usage.input_tokens == forwarded
        dropped.append(int(raw.headers["x-trimproxy-trimmed-messages"]))
        text = "".join(block.text for block in message.content if block.type == "text")
        history.append({"role": "assistant", "content": text})
    assert dropped[0] == 0 and max(dropped) > 0, dropped
    sent = orjson.loads(sim.requests("/v1/messages")[-1]["body"])
    assert sent["system"] == "You are terse."
    roles = [m["role"] for m in sent["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in pairwise(roles))


async def test_a_messages_prompt_that_cannot_fit_gets_anthropics_wording(proxy_url: str) -> None:
    body = {
        "model": "sim-model",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": words(0) * 20}],
    }
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{proxy_url}/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("prompt is too long: ")
    assert error["error"]["message"].endswith(f" > {BUDGET} maximum")


async def test_background_responses_are_refused(proxy_url: str, sim: SimUpstream) -> None:
    body = {"model": "sim-model", "input": "hi", "background": True}
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{proxy_url}/v1/responses", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "background"
    assert sim.requests("/v1/responses") == []


async def test_a_model_name_past_the_limit_is_refused_before_anything_keeps_it(
    proxy_url: str, sim: SimUpstream
) -> None:
    body = {"model": "m" * 5000, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{proxy_url}/v1/messages", json=body)
    assert r.status_code == 400
    assert "TRIMPROXY_MAX_MODEL_NAME_LENGTH" in r.json()["error"]["message"]
    assert sim.requests("/v1/messages") == []
