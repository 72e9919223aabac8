"""The vLLM wire shapes the proxy depends on, through the app in-process.

The simulated upstream speaks vLLM's OpenAI server as its source defines it
(``vllm/entrypoints/openai``): the nested ``{"error": {...}}`` envelope of v0.10.1 and
later, the flat ``{"object": "error", ...}`` of earlier releases (``error_style=
"legacy"``), ``max_model_len`` on ``/v1/models``, ``/tokenize`` with messages, and SSE
with a final ``choices: []`` usage chunk when ``stream_options.include_usage`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.inprocess import StartApp, openai_client
from tests.support.sim import SimUpstream

LONG = {"model": "sim-model", "messages": [{"role": "user", "content": "word " * 400}]}


def sse_events(body: bytes) -> list[Any]:
    events: list[Any] = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append(data.decode() if data == b"[DONE]" else orjson.loads(data))
    return events


async def test_models_listing_and_max_model_len(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm", max_model_len=3000)
    proxy = await app_proxy(upstream=sim, tokenizer="approx")
    listing = (await proxy.client.get("/v1/models")).json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == "sim-model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 3000
    # The proxy's budget follows it: 3000 - max_tokens - 1 (FastChat's slack).
    r = await proxy.client.post(
        "/v1/chat/completions",
        json={
            "model": "sim-model",
            "max_tokens": 1000,
            "messages": [
                {"role": "user", "content": "q " * 3000},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "now"},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert int(r.headers["x-trimproxy-prompt-tokens"]) <= 1999


async def test_tokenize_with_messages_passes_through(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "add_generation_prompt": True,
    }
    via_proxy = await proxy.client.post("/tokenize", json=body)
    direct = httpx.post(f"{sim_upstream.url}/tokenize", json=body)
    assert via_proxy.status_code == 200
    assert via_proxy.json() == direct.json()
    assert set(via_proxy.json()) >= {"count", "max_model_len", "tokens"}


@pytest.mark.parametrize("style", ["current", "legacy"])
async def test_over_long_prompt_error_reaches_the_sdk_as_vllm_sent_it(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream], style: str
) -> None:
    sim = sim_upstream_factory("vllm", max_model_len=128, error_style=style)
    # A window the operator set too large: the proxy lets it through, vLLM refuses.
    proxy = await app_proxy(upstream=sim, tokenizer="approx", context_window=100_000)
    direct = httpx.post(f"{sim.url}/v1/chat/completions", json=LONG)
    via_proxy = await proxy.client.post("/v1/chat/completions", json=LONG)
    assert via_proxy.status_code == direct.status_code == 400
    assert via_proxy.content == direct.content
    error = via_proxy.json()["error"] if style == "current" else via_proxy.json()
    assert "maximum context length is 128 tokens" in error["message"]
    async with openai_client(proxy) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(**LONG)  # type: ignore[call-overload]
    assert "maximum context length" in str(info.value)


async def test_stream_with_usage_is_relayed_event_for_event(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    direct = sse_events(httpx.post(f"{sim_upstream.url}/v1/chat/completions", json=body).content)
    relayed = sse_events((await proxy.client.post("/v1/chat/completions", json=body)).content)
    assert relayed[-1] == "[DONE]"
    *chunks, usage, _ = relayed
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["usage"] is None for c in chunks)  # vLLM: null on each when asked for
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] > 0

    def shape(events: list[Any]) -> list[Any]:
        return [e if isinstance(e, str) else sorted(e) for e in events]

    assert shape(relayed) == shape(direct)
