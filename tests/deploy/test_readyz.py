"""``GET /readyz`` as the Kubernetes readiness probe sees it (deploy/kubernetes).

With ``TRIMPROXY_READY_REQUIRES_UPSTREAM=false`` (the manifests' choice) an upstream
outage leaves the pod ready, and says so in the body; with the default the pod goes
unready. Either way the handler answers within ``TRIMPROXY_READY_TIMEOUT`` even when the
upstream accepts the connection and never answers, so a probe timeout above it holds.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.support.inprocess import StartApp
from tests.support.sim import SimUpstream


async def test_an_upstream_outage_keeps_the_pod_ready_when_so_configured(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm")
    proxy = await app_proxy(upstream=sim, tokenizer="approx", ready_requires_upstream=False)
    up = await proxy.client.get("/readyz")
    assert up.status_code == 200 and up.json()["upstream_ready"] is True
    sim.stop()
    down = await proxy.client.get("/readyz")
    assert down.status_code == 200, down.text
    body = down.json()
    assert body["status"] == "ready" and body["upstream_ready"] is False
    assert "GET /v1/models" in body["detail"]


async def test_the_default_takes_the_pod_out_while_the_upstream_is_down(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm")
    proxy = await app_proxy(upstream=sim, tokenizer="approx")
    assert proxy.settings.ready_requires_upstream is True
    sim.stop()
    down = await proxy.client.get("/readyz")
    assert down.status_code == 503 and down.json()["upstream_ready"] is False


@pytest.fixture
def silent_upstream() -> Iterator[str]:
    """A socket that listens and never answers: the kernel completes the handshake into
    the backlog, so a request is sent and then waits forever."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_hanging_upstream_is_bounded_by_the_ready_timeout(
    app_proxy: StartApp, silent_upstream: str
) -> None:
    # The read timeout (what forwarding waits) is far above the test client's own 30 s:
    # only TRIMPROXY_READY_TIMEOUT can end these requests in time.
    settings = {"tokenizer": "approx", "read_timeout": 600, "ready_timeout": 0.5,
                "context_window": 4096, "upstream_metrics_interval": 0}  # fmt: skip
    strict = await app_proxy(upstream=silent_upstream, **settings)
    answer = await strict.client.get("/readyz")
    assert answer.status_code == 503, answer.text
    assert "TRIMPROXY_READY_TIMEOUT" in answer.json()["detail"]
    lenient = await app_proxy(upstream=silent_upstream, ready_requires_upstream=False, **settings)
    answer = await lenient.client.get("/readyz")
    assert answer.status_code == 200 and answer.json()["upstream_ready"] is False
