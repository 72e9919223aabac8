"""Every call the proxy makes upstream carries ``TRIMPROXY_UPSTREAM_API_KEY``.

Behind a vLLM started with ``--api-key`` the proxy used to learn no context window
and count by estimate, so nothing was trimmed. Here the sim requires a key on every
route (``SimConfig.api_key``) and runs in-process on 127.0.0.1; the proxy's app runs
in-process too, through an ASGI transport, with its real lifespan.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from aiohttp import web

from proxy.metrics import Metrics
from proxy.scrape import UpstreamScraper
from proxy.settings import Settings
from proxy.sim import SimConfig, build_app
from proxy.sim.cli import add_arguments, config_from_args
from proxy.sim.state import STATE, SimState
from proxy.sim.tokenizer import prompt_ids
from proxy.tokens import ApproxCounter, build_counter
from proxy.tokens.vllm import VllmCounter
from proxy.upstream import ContextWindows, Upstream
from proxy.upstream.readiness import ready
from tests.support.inprocess import make_settings, running_proxy

KEY = "sk-upstream-secret"
WINDOW = 600


@dataclass
class LockedSim:
    url: str
    state: SimState

    def records(self, path: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.state.recorder.snapshot() if path is None or r["path"] == path]

    def authorizations(self) -> set[str | None]:
        """The Authorization header of every request received (None: none sent)."""
        return {
            next((v for k, v in r["headers"] if k.lower() == "authorization"), None)
            for r in self.records()
        }


@pytest.fixture
async def locked_sim() -> AsyncIterator[LockedSim]:
    app = build_app(SimConfig(api_key=KEY, max_model_len=WINDOW, completion_tokens=4))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield LockedSim(f"http://127.0.0.1:{runner.addresses[0][1]}", app[STATE])
    await runner.cleanup()


def settings(sim: LockedSim, key: str | None, **extra: Any) -> Settings:
    return make_settings(sim.url, upstream_api_key=key, upstream_metrics_interval=0, **extra)


@asynccontextmanager
async def client_for(s: Settings) -> AsyncIterator[Upstream]:
    upstream = Upstream(s)
    try:
        yield upstream
    finally:
        await upstream.aclose()


@asynccontextmanager
async def proxy_app(
    sim: LockedSim, key: str | None, **extra: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The real app, lifespan and all, driven in-process."""
    async with running_proxy(
        sim.url, upstream_api_key=key, upstream_metrics_interval=0, **extra
    ) as proxy:
        yield proxy.client


def conversation(turns: int, words: int = 30) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"q{k} " + "lorem ipsum " * words})
        messages.append({"role": "assistant", "content": f"a{k} " + "dolor sit " * words})
    messages.append({"role": "user", "content": "and now?"})
    return messages


async def test_discovery_sends_the_key(locked_sim: LockedSim) -> None:
    with_key = settings(locked_sim, KEY)
    async with client_for(with_key) as upstream:
        (served,) = await upstream.models()
        assert (served.id, served.max_model_len) == ("sim-model", WINDOW)
        assert await ContextWindows(upstream, with_key).get("sim-model") == WINDOW
    assert locked_sim.authorizations() == {f"Bearer {KEY}"}
    assert {r["status"] for r in locked_sim.records()} == {200}

    # Without the key the sim refuses, and the proxy learns nothing (it would not trim).
    without = settings(locked_sim, None)
    async with client_for(without) as upstream:
        assert await upstream.models() == ()
        assert await ContextWindows(upstream, without).get("sim-model") is None
    assert 401 in {r["status"] for r in locked_sim.records()}


async def test_tokenize_counter_sends_the_key(locked_sim: LockedSim) -> None:
    messages = conversation(2)
    async with client_for(settings(locked_sim, KEY)) as upstream:
        counter = await build_counter(settings(locked_sim, KEY, tokenizer="upstream"), upstream)
        assert isinstance(counter, VllmCounter)
        count = await counter.count(messages, model="sim-model")
        assert count.total == len(prompt_ids(messages, add_generation_prompt=True))
        assert counter.max_model_len == WINDOW  # /tokenize reports it too
    assert {r["path"] for r in locked_sim.records()} >= {"/v1/models", "/tokenize"}
    assert locked_sim.authorizations() == {f"Bearer {KEY}"}
    assert 401 not in {r["status"] for r in locked_sim.records()}


async def test_tokenize_without_the_key_says_which_setting(
    locked_sim: LockedSim, caplog: pytest.LogCaptureFixture
) -> None:
    messages = conversation(1)
    async with client_for(settings(locked_sim, None)) as upstream:
        with caplog.at_level(logging.WARNING, logger="trimproxy.tokens"):
            counter = await build_counter(
                settings(locked_sim, None, tokenizer="upstream"), upstream
            )
        assert "TRIMPROXY_UPSTREAM_API_KEY" in caplog.text
        assert await counter.count(messages) == await ApproxCounter().count(messages)


async def test_scrape_sends_the_key(
    locked_sim: LockedSim, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    async with client_for(settings(locked_sim, KEY)) as upstream:
        assert await UpstreamScraper(upstream, metrics, 5.0).scrape_once()
    assert metrics.registry.get_sample_value("trimproxy_upstream_metrics_up") == 1
    assert locked_sim.authorizations() == {f"Bearer {KEY}"}

    async with client_for(settings(locked_sim, None)) as upstream:
        with caplog.at_level(logging.WARNING, logger="trimproxy.scrape"):
            assert not await UpstreamScraper(upstream, metrics, 5.0).scrape_once()
    assert "HTTP 401" in caplog.text and "TRIMPROXY_UPSTREAM_API_KEY" in caplog.text
    assert metrics.registry.get_sample_value("trimproxy_upstream_metrics_up") == 0


async def test_readyz_authenticates_and_says_why_not(locked_sim: LockedSim) -> None:
    async with proxy_app(locked_sim, KEY, tokenizer="approx") as proxy:
        r = await proxy.get("/readyz")
        assert r.status_code == 200, r.text
    assert locked_sim.authorizations() == {f"Bearer {KEY}"}

    async with proxy_app(locked_sim, None, tokenizer="approx") as proxy:
        r = await proxy.get("/readyz")
    assert r.status_code == 503
    assert r.json()["status"] == "not ready"
    assert "401" in r.json()["detail"] and "TRIMPROXY_UPSTREAM_API_KEY" in r.json()["detail"]


async def test_readyz_on_5xx_and_on_no_answer(locked_sim: LockedSim) -> None:
    async with httpx.AsyncClient(base_url=locked_sim.url) as control:
        armed = await control.post(
            "/_sim/config", json={"fail_next": {"status": 503, "path": "/v1/models"}}
        )
        assert armed.status_code == 200, armed.text
    async with client_for(settings(locked_sim, KEY)) as upstream:
        readiness = await ready(upstream)
        assert not readiness.ready and "503" in readiness.detail
        assert (await ready(upstream)).ready  # the failure was for one request
    nowhere = make_settings("http://127.0.0.1:9", upstream_metrics_interval=0)
    async with client_for(nowhere) as upstream:
        readiness = await ready(upstream)
    assert not readiness.ready and "no answer" in readiness.detail


@pytest.mark.parametrize("tokenizer", ["upstream", "auto"])
async def test_a_keyed_upstream_gets_trimmed_prompts(locked_sim: LockedSim, tokenizer: str) -> None:
    """The bug itself: behind an upstream requiring a key, the window is learned from
    /v1/models, prompts are counted by /tokenize, and long conversations are trimmed."""
    messages = conversation(12)
    body = {"model": "sim-model", "messages": messages, "max_tokens": 8}
    async with proxy_app(locked_sim, KEY, tokenizer=tokenizer) as proxy:
        r = await proxy.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert int(r.headers["x-trimproxy-trimmed-messages"]) > 0
    forwarded = int(r.headers["x-trimproxy-prompt-tokens"])
    assert forwarded <= WINDOW - 8 - 1
    (chat,) = locked_sim.records("/v1/chat/completions")
    assert chat["status"] == 200 and chat["prompt_tokens"] == forwarded  # exact count
    assert locked_sim.authorizations() == {f"Bearer {KEY}"}


def test_the_sims_api_key_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--api-key", KEY])).api_key == KEY
    assert config_from_args(parser.parse_args([])).api_key is None
