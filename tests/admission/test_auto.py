"""``TRIMPROXY_KV_ADMISSION=auto``: the capacity comes from the upstream's scrape.

The upstream here is a small aiohttp server that publishes vLLM's
``vllm:cache_config_info`` (the sim does not) and answers chats at once; what it
publishes can change between scrapes, as when an engine restarts with another cache.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from proxy.admission import EngineCache
from proxy.metrics import Metrics
from proxy.scrape import UpstreamScraper
from proxy.upstream import Upstream
from tests.sessions.helpers import metric_value
from tests.support.inprocess import InProcessProxy, StartApp, make_settings


class FakeEngine:
    def __init__(self) -> None:
        self.blocks: int | None = 192
        self.block_size = 32
        self.scrapes = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        lines = ['vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0']
        if self.blocks is not None:
            lines.append(
                f'vllm:cache_config_info{{block_size="{self.block_size}",engine="0",'
                f'num_gpu_blocks="{self.blocks}",num_cpu_blocks="None"}} 1.0'
            )
        return web.Response(text="\n".join(lines) + "\n")

    async def chat(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 100_000}]})


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_get("/v1/models", fake.models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def capacity_becomes(proxy: InProcessProxy, value: float, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = await proxy.metrics_text()
        if metric_value(text, "trimproxy_kv_capacity_tokens") == value:
            return
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.05)


async def test_capacity_from_the_scrape_follows_the_engine(
    app_proxy: StartApp, engine: tuple[FakeEngine, str]
) -> None:
    fake, url = engine
    proxy = await app_proxy(
        upstream=url,
        tokenizer="approx",
        kv_admission="auto",
        kv_admission_fraction=0.5,
        upstream_metrics_interval=0.05,
    )
    await capacity_becomes(proxy, 95 * 32)  # (192 - 1) blocks x 0.5, whole blocks
    fake.blocks = 400  # the engine restarted with a larger cache
    await capacity_becomes(proxy, 199 * 32)
    chat = {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
    response = await proxy.client.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200
    assert metric_value(await proxy.metrics_text(), "trimproxy_kv_reserved_tokens") == 0


async def test_auto_without_figures_is_off_and_says_so_once(
    app_proxy: StartApp, engine: tuple[FakeEngine, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = engine
    fake.blocks = None
    with caplog.at_level(logging.WARNING, "trimproxy.admission"):
        proxy = await app_proxy(
            upstream=url, tokenizer="approx", kv_admission="auto", upstream_metrics_interval=0.05
        )
        scraped = fake.scrapes
        await until(lambda: fake.scrapes >= scraped + 4)  # several scrapes
        chat = {"model": "m", "max_tokens": 90_000, "messages": [{"role": "user", "content": "x"}]}
        response = await proxy.client.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200  # admission is off: nothing to wait for
    said = [r for r in caplog.records if "cache_config_info" in r.getMessage()]
    assert len(said) == 1
    fake.blocks = 10  # the engine now publishes its figures: admission switches on
    await capacity_becomes(proxy, 9 * 32)


async def test_a_worker_that_does_not_scrape_still_learns_the_capacity(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> None:
    """With several workers one scrapes (it holds the lock); the others read the capacity
    for their own ledgers all the same."""
    _, url = engine
    lock = tmp_path / "upstream-scraper.lock"
    seen: list[EngineCache | None] = []
    upstream = Upstream(make_settings(url))
    holder = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another worker is the scraper
    scraper = UpstreamScraper(upstream, Metrics(), 0.05, lock_path=str(lock), on_engine=seen.append)
    try:
        scraper.start()
        deadline = time.monotonic() + 5
        while not seen:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    finally:
        await scraper.stop()
        await upstream.aclose()
        os.close(holder)
    assert seen[0] == EngineCache(191 * 32, 32)
