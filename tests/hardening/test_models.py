"""Nothing a client names in ``model`` grows the proxy's memory.

The proxy learns the served models from the upstream's ``/v1/models`` (bounded,
refreshed), so a request for an unknown name neither adds a cache entry nor costs
an upstream call of its own; a name longer than the cap is a 400; an unknown model
is answered by the upstream itself (here the sim in strict mode: vLLM's 404).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_unique_model_names_cost_no_upstream_calls_and_no_memory(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0)
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        assert client.post(CHAT, json=chat("sim-model")).status_code == 200
        before = rss_mib(proxy.process.pid)
        for k in range(40):
            # 200 KiB names, each new: the old cache kept every one of them.
            name = f"{k}-" + "n" * (200 << 10)
            answer = client.post(CHAT, json=chat(name))
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "model"
        for k in range(200):
            answer = client.post(CHAT, json=chat(f"unknown-{k}"))
            assert answer.status_code == 200, answer.text
    grown = rss_mib(proxy.process.pid) - before
    assert grown < 30, f"RSS grew by {grown:.1f} MiB"
    listings = sim_upstream.requests("/v1/models")
    assert len(listings) <= 2, len(listings)


def test_unknown_model_is_answered_the_way_the_upstream_does(
    proxy_server: StartProxy, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory(strict_model=True)
    proxy = proxy_server(upstream=sim, tokenizer="approx", upstream_metrics_interval=0)
    direct = httpx.post(sim.url + CHAT, json=chat("no-such-model"), timeout=30)
    proxied = httpx.post(proxy.url + CHAT, json=chat("no-such-model"), timeout=30)
    assert proxied.status_code == direct.status_code == 404
    assert proxied.json() == direct.json()


def test_served_models_are_learned_again_after_the_refresh_interval(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0, models_refresh=1)
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        answer = client.post(CHAT, json={**chat("sim-model"), "max_tokens": 4000})
        assert answer.status_code == 200, answer.text
        listed = len(sim_upstream.requests("/v1/models"))
        sim_upstream.configure(max_model_len=1000)
        # Small requests until one, past TRIMPROXY_MODELS_REFRESH, has the proxy ask
        # for the list again; the deadline is a hang guard, not a measure.
        deadline = time.monotonic() + 15
        while len(sim_upstream.requests("/v1/models")) == listed:
            assert time.monotonic() < deadline, "the served models were never asked again"
            assert client.post(CHAT, json=chat("sim-model")).status_code == 200
            time.sleep(0.05)
        answer = client.post(CHAT, json={**chat("sim-model"), "max_tokens": 4000})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "1000" in answer.json()["error"]["message"]
