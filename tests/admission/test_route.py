"""KV admission on the chat route, against the sim: waiting, 429, and a release on every
ending — success (plain and streamed), upstream error, unreachable upstream, a client
that leaves mid-stream or while waiting in line.

Each request reserves ``forwarded prompt + max_tokens``; with ``max_tokens`` 600 and a
capacity of 1,000, two requests never run at once, whatever the prompt's exact count.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.sessions.helpers import metric_value
from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
ADMISSION = {"tokenizer": "approx", "kv_admission": "1000"}
WAIT = "x-trimproxy-admission-wait-ms"


def body(max_tokens: int = 600, stream: bool = False, text: str = "hello there") -> dict[str, Any]:
    return {
        "model": "sim-model",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


async def reserved(proxy: InProcessProxy) -> float:
    return metric_value(await proxy.metrics_text(), "trimproxy_kv_reserved_tokens")


async def post(proxy: InProcessProxy, payload: dict[str, Any]) -> httpx.Response:
    return await proxy.client.post("/v1/chat/completions", json=payload)


async def test_second_request_waits_its_turn(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(**ADMISSION)
    sim_upstream.configure(delay_seconds=0.4, completion_tokens=4)
    first, second = await asyncio.gather(post(proxy, body()), post(proxy, body()))
    assert first.status_code == second.status_code == 200
    waited = [r for r in (first, second) if WAIT in r.headers]
    assert len(waited) == 1 and int(waited[0].headers[WAIT]) >= 100
    text = await proxy.metrics_text()
    assert metric_value(text, "trimproxy_kv_capacity_tokens") == 1000
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0
    assert metric_value(text, "trimproxy_admission_wait_seconds_count") == 2


async def test_timeout_is_429_and_nothing_leaks(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(**ADMISSION, admission_timeout=0.1)
    sim_upstream.configure(delay_seconds=0.6, completion_tokens=4)
    first, second = await asyncio.gather(post(proxy, body()), post(proxy, body()))
    statuses = sorted((first.status_code, second.status_code))
    assert statuses == [200, 429]
    refused = first if first.status_code == 429 else second
    error = refused.json()["error"]
    assert error["code"] == "overloaded" and error["type"] == "rate_limit_error"
    assert "TRIMPROXY_ADMISSION_TIMEOUT" in error["message"]
    assert refused.headers["retry-after"] == "1"
    text = await proxy.metrics_text()
    assert metric_value(text, "trimproxy_admission_rejected_total", reason="timeout") == 1
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0


async def test_streamed_answers_release(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    proxy = await app_proxy(**ADMISSION)
    for _ in range(3):  # would block for good if a stream kept its reservation
        response = await post(proxy, body(stream=True))
        assert response.status_code == 200 and "[DONE]" in response.text
    assert await reserved(proxy) == 0


async def test_upstream_errors_release(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    strict = sim_upstream_factory(strict_model=True)
    proxy = await app_proxy(upstream=strict, **ADMISSION, admission_timeout=1)
    for _ in range(3):  # the upstream refuses the model: 404, relayed as it is
        response = await post(proxy, {**body(), "model": "no-such-model"})
        assert response.status_code == 404
    assert await reserved(proxy) == 0

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    gone = await app_proxy(
        upstream=f"http://127.0.0.1:{closed_port}", **ADMISSION, admission_timeout=1
    )
    for _ in range(3):
        response = await post(gone, body())
        assert response.status_code == 502
    assert await reserved(gone) == 0


async def test_a_request_larger_than_the_capacity_is_served_alone(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(**ADMISSION)
    response = await post(proxy, body(max_tokens=3000))
    assert response.status_code == 200
    assert await reserved(proxy) == 0


def metrics_text(proxy: ProxyProcess) -> str:
    return httpx.get(f"{proxy.url}/metrics", timeout=5).text


def process_reserved(proxy: ProxyProcess) -> float:
    return metric_value(metrics_text(proxy), "trimproxy_kv_reserved_tokens")


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def open_raw(proxy: ProxyProcess, payload: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.sendall(
        (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n{payload}"
        ).encode()
    )
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_releases(
    proxy_server: StartProxy, sim_upstream: SimUpstream, stream: bool
) -> None:
    """Mid-answer and while waiting in line: both give their tokens back at once."""
    proxy = proxy_server(**ADMISSION)
    sim_upstream.configure(tokens_per_second=4, completion_tokens=200)
    payload = (
        '{"model": "sim-model", "max_tokens": 600, "stream": %s, '
        '"messages": [{"role": "user", "content": "write a long story"}]}'
    ) % ("true" if stream else "false")
    running = open_raw(proxy, payload)
    sim_upstream.wait_for_state(lambda s: s["running"] == 1, timeout=5)
    if stream:
        assert b"data:" in running.recv(4096)  # the stream is flowing
    waiting = open_raw(proxy, payload)  # no room: it waits in line
    wait_until(lambda: metric_value(metrics_text(proxy), "trimproxy_requests_in_flight") == 2)
    assert process_reserved(proxy) > 600  # one request's prompt + 600
    waiting.close()  # leaves the line
    wait_until(  # the proxy saw it leave before the running one frees its room
        lambda: (
            metric_value(
                metrics_text(proxy), "trimproxy_admission_rejected_total", reason="client_closed"
            )
            == 1
        )
    )
    running.close()  # leaves mid-answer
    wait_until(lambda: process_reserved(proxy) == 0)
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert metric_value(text, "trimproxy_admission_rejected_total", reason="client_closed") == 1
    sim_upstream.wait_for_state(lambda s: s["running"] == 0, timeout=5)
    assert len(sim_upstream.chat_requests()) == 1  # the one that left the line never went
