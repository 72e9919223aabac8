"""The upstream's KV-cache usage and queue, scraped from its /metrics by the proxy
(in-process; a real process where a client must go away) and re-exported as
``trimproxy_upstream_*``."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import orjson
import pytest

from tests.observability.promtext import Scrape, ascrape, await_scrape, wait_for_scrape
from tests.support.inprocess import StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

INTERVAL = 0.5
# One scrape interval, plus what a loaded 2-core CI machine needs to run the scrape,
# serve /metrics and poll it.
WITHIN = INTERVAL + 1.0
KV = "trimproxy_upstream_kv_cache_usage_ratio"


def kv_is(value: float) -> Callable[[Scrape], bool]:
    return lambda s: s.value(KV) == value and s.value("trimproxy_upstream_metrics_up") == 1


@pytest.mark.parametrize(
    "legacy", [False, True], ids=["kv_cache_usage_perc", "gpu_cache_usage_perc"]
)
async def test_kv_gauge_follows_the_upstream_within_one_interval(
    app_proxy: StartApp, sim_upstream: SimUpstream, legacy: bool
) -> None:
    sim_upstream.configure(legacy_metrics=legacy, kv_usage_override=0.25)
    name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    assert f"{name}{{" in sim_upstream.metrics()
    proxy = await app_proxy(upstream_metrics_interval=INTERVAL)
    await await_scrape(proxy.client, kv_is(0.25))
    for value in (0.875, 0.0, 0.5):
        sim_upstream.configure(kv_usage_override=value)
        _, took = await await_scrape(proxy.client, kv_is(value), timeout=5.0)
        assert took < WITHIN, f"KV usage {value} took {took:.2f}s to show"


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
        m, _ = wait_for_scrape(
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
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trimproxy")
    fastchat = sim_upstream_factory("fastchat")
    proxy = await app_proxy(upstream=fastchat, upstream_metrics_interval=0.1)
    client = proxy.client
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    m, _ = await await_scrape(proxy.client, lambda s: s.has("trimproxy_upstream_metrics_up"))
    await await_scrape(proxy.client, lambda s: len(fastchat.requests("/metrics")) >= 3, timeout=5.0)
    # Without back-off, 3 s at 0.1 s would be 30 scrapes; doubling gives about 5.
    scrapes = len(fastchat.requests("/metrics"))
    assert all(r["status"] == 404 for r in fastchat.requests("/metrics"))
    m = await ascrape(proxy.client)
    assert m.value("trimproxy_upstream_metrics_up") == 0
    assert m.value(KV) == 0
    said = [line for line in caplog.messages if "has no" in line and "/metrics" in line]
    assert len(said) == 1, said
    assert scrapes <= 6, f"{scrapes} scrapes of a /metrics that is not there"


async def test_interval_zero_turns_the_scrape_off(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(upstream_metrics_interval=0)
    client = proxy.client
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert sim_upstream.requests("/metrics") == []
    assert (await ascrape(proxy.client)).value("trimproxy_upstream_metrics_up") == 0
