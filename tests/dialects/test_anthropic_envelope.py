"""Every answer the proxy itself gives on the Messages paths is in Anthropic's envelope,
those of the middleware in front of every route included (a refused key, the
in-flight limit, a body too large), so the anthropic SDK raises its own typed errors;
on the OpenAI paths the same refusals keep OpenAI's envelope. A real proxy served
over HTTP in front of the sim."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from proxy.app import create_app
from proxy.metrics import Metrics
from tests.support.closing import AsyncClosing
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream

KEY = "sk-envelope-test"
BODY_LIMIT = 4096


@pytest.fixture
async def proxy_url(sim: SimUpstream) -> AsyncIterator[str]:
    settings = make_settings(
        sim.url,
        tokenizer="approx",
        api_keys=KEY,
        max_in_flight=1,
        max_body_bytes=BODY_LIMIT,
        upstream_metrics_interval=0,
    )
    async with served(create_app(settings, Metrics())) as url:
        yield url


def _message(**fields: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def _anthropic(body: dict[str, Any], kind: str) -> str:
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    return message


async def test_a_refused_key_is_anthropics_authentication_error(
    aclosing: AsyncClosing, proxy_url: str
) -> None:
    client = await aclosing(
        anthropic.AsyncAnthropic(base_url=proxy_url, api_key="wrong", max_retries=0)
    )
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await client.messages.create(**_message())
    assert isinstance(refused.value.body, dict)
    assert "TRIMPROXY_API_KEYS" in _anthropic(refused.value.body, "authentication_error")
    # count_tokens is a Messages path too; chat keeps OpenAI's envelope.
    async with httpx.AsyncClient(base_url=proxy_url) as http:
        counted = await http.post("/v1/messages/count_tokens", json=_message())
        assert counted.status_code == 401
        _anthropic(counted.json(), "authentication_error")
        chat = await http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"
    # The right key, as the SDK sends it (X-Api-Key), is served.
    client = await aclosing(
        anthropic.AsyncAnthropic(base_url=proxy_url, api_key=KEY, max_retries=0)
    )
    assert (await client.messages.create(**_message())).type == "message"


async def test_a_body_too_large_is_anthropics_request_too_large(
    aclosing: AsyncClosing, proxy_url: str
) -> None:
    client = await aclosing(
        anthropic.AsyncAnthropic(base_url=proxy_url, api_key=KEY, max_retries=0)
    )
    big = [{"role": "user", "content": "word " * BODY_LIMIT}]
    with pytest.raises(anthropic.APIStatusError) as refused:
        await client.messages.create(**_message(messages=big))
    assert refused.value.status_code == 413 and isinstance(refused.value.body, dict)
    assert "TRIMPROXY_MAX_BODY_BYTES" in _anthropic(refused.value.body, "request_too_large")


async def test_the_in_flight_limit_is_anthropics_rate_limit_error(
    aclosing: AsyncClosing, proxy_url: str, sim: SimUpstream
) -> None:
    sim.configure(delay_seconds=1.0)
    before = sim.state()["requests_total"]
    client = await aclosing(
        anthropic.AsyncAnthropic(base_url=proxy_url, api_key=KEY, max_retries=0)
    )
    first = asyncio.ensure_future(client.messages.create(**_message()))
    # The first one is in flight once the sim has it (it answers a second later).
    await asyncio.to_thread(sim.wait_for_state, lambda s: s["requests_total"] > before)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await client.messages.create(**_message())
    assert refused.value.response.headers["retry-after"] == "1"
    assert isinstance(refused.value.body, dict)
    assert "TRIMPROXY_MAX_IN_FLIGHT" in _anthropic(refused.value.body, "rate_limit_error")
    assert (await first).type == "message"
