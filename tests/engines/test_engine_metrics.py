"""Per-engine KV admission and metrics, against two sim engines behind a real trimproxy."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from proxy.settings import Settings
from proxy.upstream import Upstream
from tests.observability.promtext import Scrape, parse, wait_for_scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream, sim_threads


@pytest.fixture
def sims() -> Iterator[list[SimUpstream]]:
    with sim_threads(2) as engines:
        yield engines


def released(page: Scrape, engine: str) -> bool:
    return page.value("trimproxy_engine_kv_reserved_tokens", engine=engine) == 0


def test_each_engine_has_its_ledger_its_scrape_and_its_counters(sims: list[SimUpstream]) -> None:
    settings = {
        "upstream_url": ",".join(s.url for s in sims),
        "tokenizer": "approx",
        "routing": "round_robin",
        "kv_admission": "auto",
        "upstream_metrics_interval": 0.2,
    }
    labels = [s.url.removeprefix("http://") for s in sims]
    with ProxyProcess(settings) as proxy:
        deadline = time.monotonic() + 20
        while True:  # until both engines' capacities were scraped
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            capacities = [
                page.value("trimproxy_engine_kv_capacity_tokens", engine=x) for x in labels
            ]
            if all(capacities):
                break
            assert time.monotonic() < deadline, proxy.logs()[-3000:]
            time.sleep(0.1)
        for turn in range(4):
            body = {"model": "sim-model", "messages": [{"role": "user", "content": f"hi {turn}"}]}
            r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
        # A reservation is released just after its answer's end.
        page = wait_for_scrape(proxy.url, lambda p: all(released(p, x) for x in labels))
    # Each engine's own capacity, and the total is their sum.
    assert page.value("trimproxy_kv_capacity_tokens") == sum(capacities)
    for label in labels:
        assert page.value("trimproxy_engine_requests_total", engine=label) == 2
        assert page.value("trimproxy_engine_up", engine=label) == 1
        assert page.value("trimproxy_engine_kv_reserved_tokens", engine=label) == 0
        assert page.has("trimproxy_engine_kv_cache_usage_ratio", engine=label)
        assert page.has("trimproxy_engine_requests_running", engine=label)
        assert page.has("trimproxy_engine_prefix_cache_hit_ratio", engine=label)
    assert [len(s.chat_requests()) for s in sims] == [2, 2]


async def test_only_an_upstream_of_one_url_for_good_has_a_lone_engine() -> None:
    for url, lone in (
        ("http://127.0.0.1:9", True),
        ("http://127.0.0.1:9,http://127.0.0.2:9", False),
        ("dns+http://engines.invalid:8000", False),  # may resolve to several
    ):
        upstream = Upstream(Settings(upstream_url=url))
        try:
            assert (upstream.lone is not None) is lone, url
        finally:
            await upstream.aclose()


def test_one_engine_takes_the_short_path_and_is_still_counted(sims: list[SimUpstream]) -> None:
    one = sims[0].url
    settings = {"upstream_url": one, "tokenizer": "approx", "upstream_metrics_interval": 0}
    label = one.removeprefix("http://")
    with ProxyProcess(settings) as proxy:
        for turn in range(3):
            body = {"model": "sim-model", "messages": [{"role": "user", "content": f"hi {turn}"}]}
            r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
        page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
        logs = proxy.logs()
    assert page.value("trimproxy_engine_requests_total", engine=label) == 3
    assert logs.count(f'"engine":"{label}"') == 3
    assert len(sims[0].chat_requests()) == 3 and not sims[1].chat_requests()
