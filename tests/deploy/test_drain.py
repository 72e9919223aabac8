"""The drain that deploy/kubernetes relies on (preStop, then SIGTERM, then the grace
period): a stream in flight when ``trimproxy serve`` gets SIGTERM runs to its end and
the process then exits cleanly; ``TRIMPROXY_GRACEFUL_SHUTDOWN_TIMEOUT`` bounds the wait,
cutting what is still open (the client sees a failure, never a clean end) so that the
process is gone before Kubernetes' SIGKILL."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
StartSim = Callable[..., SimUpstream]
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def stream_across_sigterm(proxy: ProxyProcess, body: dict[str, Any]) -> tuple[bytes, str]:
    """Start a stream, SIGTERM the proxy after its first chunk, read on; returns what
    arrived and how the transfer ended ("complete" or the error's name)."""
    received = b""
    with (
        httpx.Client(timeout=httpx.Timeout(120.0)) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_raw()
        received += next(chunks)
        proxy.process.send_signal(signal.SIGTERM)
        try:
            for chunk in chunks:
                received += chunk
        except httpx.TransportError as exc:
            return received, type(exc).__name__
    return received, "complete"


def test_a_stream_in_flight_at_sigterm_finishes_then_the_process_exits(
    proxy_server: StartProxy, sim_upstream_factory: StartSim
) -> None:
    # About two seconds of generation: the SIGTERM lands in the middle of it.
    sim = sim_upstream_factory("vllm", tokens_per_second=20, completion_tokens=40)
    proxy = proxy_server(upstream=sim, tokenizer="approx", graceful_shutdown_timeout=120)
    received, ended = stream_across_sigterm(proxy, CHAT)
    assert ended == "complete"
    assert received.rstrip().endswith(b"data: [DONE]"), received[-200:]
    # uvicorn re-raises the signal once its shutdown is done: -SIGTERM is a clean exit.
    assert proxy.process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in proxy.logs()


def test_the_graceful_timeout_cuts_a_stream_that_would_outlast_it(
    proxy_server: StartProxy, sim_upstream_factory: StartSim
) -> None:
    # A stream of several minutes against a one-second drain.
    sim = sim_upstream_factory("vllm", tokens_per_second=2, completion_tokens=1000)
    proxy = proxy_server(upstream=sim, tokenizer="approx", graceful_shutdown_timeout=1)
    received, ended = stream_across_sigterm(proxy, CHAT)
    assert b"[DONE]" not in received
    # An aborted chunked transfer: the client cannot mistake it for a complete answer.
    assert ended == "RemoteProtocolError", (ended, received[-200:])
    proxy.process.wait(timeout=60)
    assert "timeout graceful shutdown exceeded" in proxy.logs()
