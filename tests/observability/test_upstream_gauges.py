"""The upstream's KV-cache usage and queue, scraped from its /metrics by the proxy
(in-process; a real process where a client must go away) and re-exported as
``trimproxy_upstream_*``.

In-process, the app's scraper sleeps on a ``SteppedSleep``: the test lets it scrape
once more and then reads the gauges, so "within one scrape" is counted, not timed.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable

import orjson
import pytest

from proxy import fleet
from proxy.scrape import build_scraper
from tests.observability.promtext import Scrape, ascrape, wait_for_scrape
from tests.support.clock import SteppedSleep
from tests.support.inprocess import StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

INTERVAL = 0.5
KV = "trimproxy_upstream_kv_cache_usage_ratio"


@pytest.fixture
def scrape_ticks(monkeypatch: pytest.MonkeyPatch) -> SteppedSleep:
    """The sleep of every scraper the in-process app builds from here on."""
    sleep = SteppedSleep()
    monkeypatch.setattr(fleet, "build_scraper", functools.partial(build_scraper, sleep=sleep))
    return sleep


def kv_is(value: float) -> Callable[[Scrape], bool]:
    return lambda s: s.value(KV) == value and s.value("trimproxy_upstream_metrics_up") == 1


@pytest.mark.parametrize(
    "legacy", [False, True], ids=["kv_cache_usage_perc", "gpu_cache_usage_perc"]
)
async def test_kv_gauge_follows_the_upstream_within_one_scrape(
    app_proxy: StartApp, sim_upstream: SimUpstream, scrape_ticks: SteppedSleep, legacy: bool
) -> None:
    sim_upstream.configure(legacy_metrics=legacy, kv_usage_override=0.25)
    name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    assert f"{name}{{" in sim_upstream.metrics()
    asked = len(sim_upstream.requests("/metrics"))  # that look was one
    proxy = await app_proxy(upstream_metrics_interval=INTERVAL)
    await scrape_ticks.parked()  # the first scrape is done
    first = await ascrape(proxy.client)
    assert kv_is(0.25)(first), first.text
    for value in (0.875, 0.0, 0.5):
        sim_upstream.configure(kv_usage_override=value)
        await scrape_ticks.rounds(1)
        m = await ascrape(proxy.client)
        assert kv_is(value)(m), f"KV usage {value} not shown after one scrape:\n{m.text}"
    assert scrape_ticks.slept == [INTERVAL] * 4
    assert len(sim_upstream.requests("/metrics")) - asked == 4


def test_running_and_waiting_follow_the_upstream(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(upstream_metrics_interval=0.2)
    sim_upstream.configure(tokens_per_second=0.5)  # one generation running for 30 s
    body = orjson.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]})
    # A raw socket, so that closing it at the end is a client going away: the proxy
    # then closes its upstream request and the sim frees the slot at once.
    with socket.create_connection(("127.0.0.1", proxy.port)) as held:
        held.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sim_upstream.wait_for_state(lambda s: s["running"] + s["waiting"] == 1)
        m = wait_for_scrape(
            proxy.url,
            lambda s: (
                s.value("trimproxy_upstream_requests_running")
                + s.value("trimproxy_upstream_requests_waiting")
                == 1
            ),
        )
        state = sim_upstream.state()
        assert m.value("trimproxy_upstream_requests_running") == state["running"]
        assert m.value("trimproxy_upstream_requests_waiting") == state["waiting"]
    sim_upstream.wait_for_state(lambda s: s["running"] + s["waiting"] == 0)
    wait_for_scrape(proxy.url, lambda s: s.value("trimproxy_upstream_requests_running") == 0)


async def test_fastchat_without_metrics_is_said_once_and_backed_off(
    app_proxy: StartApp,
    sim_upstream_factory: Callable[..., SimUpstream],
    scrape_ticks: SteppedSleep,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trimproxy")
    fastchat = sim_upstream_factory("fastchat")
    proxy = await app_proxy(upstream=fastchat, upstream_metrics_interval=0.1)
    client = proxy.client
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    await scrape_ticks.rounds(3)
    # Each failed scrape doubles the wait for the next: 4 scrapes ask for 3 s of sleep,
    # where the interval alone would have scraped 30 times.
    assert scrape_ticks.slept == [0.2, 0.4, 0.8, 1.6]
    scrapes = fastchat.requests("/metrics")
    assert len(scrapes) == 4
    assert all(r["status"] == 404 for r in scrapes)
    m = await ascrape(proxy.client)
    assert m.has("trimproxy_upstream_metrics_up")
    assert m.value("trimproxy_upstream_metrics_up") == 0
    assert m.value(KV) == 0
    said = [line for line in caplog.messages if "has no" in line and "/metrics" in line]
    assert len(said) == 1, said


async def test_interval_zero_turns_the_scrape_off(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(upstream_metrics_interval=0)
    client = proxy.client
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert sim_upstream.requests("/metrics") == []
    assert (await ascrape(proxy.client)).value("trimproxy_upstream_metrics_up") == 0
