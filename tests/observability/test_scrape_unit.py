"""The upstream scraper in-process, against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from proxy.metrics import Metrics
from proxy.scrape import UpstreamScraper, next_delay, parse_stats
from proxy.settings import Settings
from proxy.upstream import Upstream
from tests.support.clock import SteppedSleep

VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:kv_cache_usage_perc_extra not the same family
# TYPE vllm:kv_cache_usage_perc_extra gauge
vllm:kv_cache_usage_perc_extra 0.99
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 5.0
"""


def test_parse_aggregates_engines_max_kv_and_summed_queues() -> None:
    stats = parse_stats(VLLM_V1)
    assert stats.kv_cache_usage == 0.75
    assert stats.running == 5
    assert stats.waiting == 1


def test_parse_older_name_and_prefers_the_newer_when_both() -> None:
    old = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_stats(old).kv_cache_usage == 0.5
    assert parse_stats(old).running is None
    both = old + 'vllm:kv_cache_usage_perc{model_name="m"} 0.125\n'
    assert parse_stats(both).kv_cache_usage == 0.125


def test_parse_without_kv_or_with_nan() -> None:
    assert parse_stats("").kv_cache_usage is None
    assert parse_stats("up 1\n").kv_cache_usage is None
    assert parse_stats("vllm:kv_cache_usage_perc NaN\n").kv_cache_usage is None


class FakeEngine:
    """A loopback server whose ``/metrics`` answers ``status`` with ``body``."""

    def __init__(self) -> None:
        self.status = 200
        self.body = VLLM_V1
        self.hits = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(status=self.status, text=self.body)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_get("/metrics", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


@pytest.fixture
async def client(upstream: FakeEngine) -> AsyncIterator[Upstream]:
    """The proxy's upstream client, pointed at the fake engine."""
    own = Upstream(Settings(upstream_url=upstream.url))
    yield own
    await own.aclose()


def value(metrics: Metrics, name: str) -> float:
    result = metrics.registry.get_sample_value(name)
    assert result is not None
    return result


async def test_scrape_exports_and_says_a_404_once(
    upstream: FakeEngine, client: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    scraper = UpstreamScraper(client, metrics, 5.0)
    assert await scraper.scrape_once()
    assert value(metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0.75
    assert value(metrics, "trimproxy_upstream_requests_running") == 5
    assert value(metrics, "trimproxy_upstream_requests_waiting") == 1
    assert value(metrics, "trimproxy_upstream_metrics_up") == 1

    upstream.status = 404
    with caplog.at_level(logging.INFO, logger="trimproxy.scrape"):
        for _ in range(5):
            assert not await scraper.scrape_once()
    assert len([r for r in caplog.records if "404" in r.getMessage()]) == 1
    assert value(metrics, "trimproxy_upstream_metrics_up") == 0
    # The last value stays; metrics_up says it is stale.
    assert value(metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0.75

    upstream.status = 200
    upstream.body = VLLM_V1.replace("0.75", "0.5")
    assert await scraper.scrape_once()
    assert value(metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0.5


async def test_unreachable_and_metricless_upstreams(
    upstream: FakeEngine, client: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    upstream.body = "# a /metrics of something else\nup 1\n"
    with caplog.at_level(logging.INFO, logger="trimproxy.scrape"):
        scraper = UpstreamScraper(client, metrics, 5.0)
        assert not await scraper.scrape_once()
        assert not await scraper.scrape_once()
        nowhere = Upstream(Settings(upstream_url="http://127.0.0.1:9"))  # discard port
        gone = UpstreamScraper(nowhere, metrics, 5.0)
        assert not await gone.scrape_once()
        assert not await gone.scrape_once()
        await nowhere.aclose()
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "has no vllm:kv_cache_usage_perc" in m]) == 1
    assert len([m for m in messages if "failed" in m]) == 1
    assert value(metrics, "trimproxy_upstream_metrics_up") == 0


@pytest.mark.parametrize(
    ("interval", "outcomes", "delays"),
    [
        (5.0, [True, True], [5.0, 5.0]),
        (5.0, [False, False, False, False], [10.0, 20.0, 40.0, 60.0]),  # capped at a minute
        (5.0, [False, False, True, False], [10.0, 20.0, 5.0, 10.0]),  # a good scrape resets
        (90.0, [False, False], [90.0, 90.0]),  # never sooner than the interval asks
    ],
)
def test_backoff_doubles_to_a_cap_and_resets(
    interval: float, outcomes: list[bool], delays: list[float]
) -> None:
    delay = interval
    seen = []
    for ok in outcomes:
        delay = next_delay(delay, ok, interval)
        seen.append(delay)
    assert seen == delays


async def test_background_task_sleeps_the_backoff(upstream: FakeEngine, client: Upstream) -> None:
    """The loop itself, with the sleep injected: no wall-clock waiting."""
    upstream.status = 404
    slept: list[float] = []
    done = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            upstream.status = 200  # the engine comes back
        if len(slept) == 5:
            done.set()
        await asyncio.sleep(0)

    scraper = UpstreamScraper(client, Metrics(), 5.0, sleep=sleep)
    scraper.start()
    await asyncio.wait_for(done.wait(), timeout=10)
    await scraper.stop()
    assert slept[:5] == [10.0, 20.0, 40.0, 5.0, 5.0]


async def test_background_task_backs_off_while_the_upstream_has_nothing(
    upstream: FakeEngine, client: Upstream
) -> None:
    upstream.status = 404
    sleep = SteppedSleep()
    scraper = UpstreamScraper(client, Metrics(), 0.05, sleep=sleep)
    scraper.start()
    await sleep.rounds(3)
    await scraper.stop()
    # One scrape a round, each round's sleep twice the last: 4 scrapes in 1.5 s, not 30.
    assert upstream.hits == 4
    assert sleep.slept == [0.1, 0.2, 0.4, 0.8]
    upstream.status = 200
    upstream.hits = 0
    sleep = SteppedSleep()
    scraper = UpstreamScraper(client, Metrics(), 0.05, sleep=sleep)
    scraper.start()
    await sleep.rounds(5)
    await scraper.stop()
    assert upstream.hits == 6
    assert sleep.slept == [0.05] * 6


async def test_only_the_lock_holder_scrapes(
    upstream: FakeEngine, client: Upstream, tmp_path: Path
) -> None:
    lock = str(tmp_path / "upstream-scraper.lock")
    first_sleep, second_sleep = SteppedSleep(), SteppedSleep()
    first = UpstreamScraper(client, Metrics(), 0.05, lock_path=lock, sleep=first_sleep)
    second_metrics = Metrics()
    second = UpstreamScraper(client, second_metrics, 0.05, lock_path=lock, sleep=second_sleep)
    first.start()
    await first_sleep.parked()  # it took the lock and scraped
    second.start()
    await second_sleep.rounds(2)
    # The second never scraped: its gauge still has the value it was created with.
    assert upstream.hits == 1
    assert value(second_metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0
    await first.stop()  # releases the lock; the second takes over
    await second_sleep.rounds(1)
    await second.stop()
    assert upstream.hits == 2
    assert value(second_metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0.75
    assert value(second_metrics, "trimproxy_upstream_metrics_up") == 1


async def test_a_malformed_metrics_page_is_a_failed_scrape(
    upstream: FakeEngine, client: Upstream
) -> None:
    upstream.body = 'vllm:kv_cache_usage_perc{engine="0" 0.5\n'
    metrics = Metrics()
    sleep = SteppedSleep()
    scraper = UpstreamScraper(client, metrics, 0.05, sleep=sleep)
    assert not await scraper.scrape_once()
    assert value(metrics, "trimproxy_upstream_metrics_up") == 0
    scraper.start()  # and the background task lives on through it
    await sleep.rounds(2)
    assert sleep.slept == [0.1, 0.2, 0.4]  # three more failed scrapes, backing off
    upstream.body = VLLM_V1
    await sleep.rounds(1)
    await scraper.stop()
    assert sleep.slept[-1] == 0.05  # a good scrape resets the backoff
    assert value(metrics, "trimproxy_upstream_kv_cache_usage_ratio") == 0.75
