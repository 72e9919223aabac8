"""Two proxy processes sharing one Redis ledger, the load split between them: what they
hold together, sampled from both ``/metrics`` all through the load, never exceeds the
capacity — and each of them admits while the other holds reservations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.sessions.helpers import metric_value
from tests.support.processes import ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream

pytestmark = pytest.mark.redis

StartProxy = Callable[..., ProxyProcess]
CAPACITY = 2000
REQUESTS = 16
MAX_TOKENS = 300  # each request reserves ~310-330: at most six run at once


def reserved(proxy: ProxyProcess, client: httpx.Client) -> float:
    text = client.get(f"{proxy.url}/metrics").text
    return metric_value(text, "trimproxy_kv_reserved_tokens")


def test_two_replicas_never_hold_more_than_the_capacity(
    proxy_server: StartProxy, sim_upstream: SimUpstream, redis_server: RedisServer
) -> None:
    settings = {
        "tokenizer": "approx",
        "kv_admission": CAPACITY,
        "redis_url": redis_server.url,
        "admission_timeout": 120,
    }
    replicas = [proxy_server(**settings) for _ in range(2)]
    sim_upstream.configure(tokens_per_second=40, completion_tokens=12)
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        with httpx.Client(timeout=5) as client:
            while not done.is_set():
                samples.append((reserved(replicas[0], client), reserved(replicas[1], client)))
                time.sleep(0.02)

    def one(i: int) -> int:
        body = {
            "model": "sim-model",
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": f"request {i}: tell me a story"}],
        }
        url = f"{replicas[i % 2].url}/v1/chat/completions"
        return httpx.post(url, json=body, timeout=120).status_code

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(REQUESTS) as pool:
            statuses = list(pool.map(one, range(REQUESTS)))
    finally:
        done.set()
        sampler.join(10)
    assert statuses == [200] * REQUESTS
    sums = [a + b for a, b in samples]
    print(f"\n{len(samples)} samples; the most held at once: {max(sums):.0f} of {CAPACITY}")
    assert max(sums) <= CAPACITY
    assert any(a > 0 and b > 0 for a, b in samples)  # both replicas admitted side by side
    assert max(sums) > CAPACITY / 2  # the load did fill the ledger
    assert samples[-1] == (0, 0) or sums[-1] <= CAPACITY
