"""Every error row of docs/architecture.md §14, one test each, through the app in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.processes import free_port
from tests.support.sim import SimUpstream

HELLO = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def assert_envelope(response: httpx.Response, status: int, code: str, param: Any = "any") -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and isinstance(error["code"], str)
    if param != "any":
        assert error["param"] == param
    message: str = error["message"]
    assert len(message) > 20
    assert "Traceback" not in message and "/work" not in message and ".py" not in message
    return message


@pytest.fixture
async def proxy(app_proxy: StartApp) -> InProcessProxy:
    return await app_proxy(tokenizer="approx", max_body_bytes=4096, max_prompt_tokens=300)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"model": "m"}', "messages", "required"),
        (b'{"model": "m", "messages": []}', "messages", "at least one"),
        (b'{"model": "m", "messages": "hi"}', "messages", "list"),
        (b'{"model": "m", "messages": [{"content": "no role"}]}', "messages", "role"),
        (b'{"model": "m", "messages": [{"role": "user"}, 1]}', "messages", "messages[1] must"),
        (b'{"model": "m", "messages": [{"role": "user"}, {"role": 5}]}', "messages", "[1] has no"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -3}', "max_tokens", ""),
        (b'{"model": 7, "messages": [{"role": "user"}]}', "model", "string"),
    ],
)
async def test_malformed_request_is_400_invalid_request(
    proxy: InProcessProxy, sim_upstream: SimUpstream, body: bytes, param: str | None, says: str
) -> None:
    r = await proxy.client.post("/v1/chat/completions", content=body)
    message = assert_envelope(r, 400, "invalid_request", param)
    assert says in message
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert sim_upstream.chat_requests() == []


async def test_prompt_that_cannot_fit_is_refused_and_never_forwarded(
    proxy: InProcessProxy, sim_upstream: SimUpstream
) -> None:
    body = {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "old question"},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "word " * 600},
        ],
    }
    r = await proxy.client.post("/v1/chat/completions", json=body)
    message = assert_envelope(r, 400, "context_length_exceeded", "messages")
    assert "300" in message
    assert sim_upstream.chat_requests() == []


async def test_max_tokens_larger_than_the_window_is_refused(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", context_window=1000)
    r = await proxy.client.post("/v1/chat/completions", json={**HELLO, "max_tokens": 1000})
    assert_envelope(r, 400, "context_length_exceeded", "max_tokens")


async def test_body_over_the_limit_is_413(proxy: InProcessProxy, sim_upstream: SimUpstream) -> None:
    big = {"model": "sim-model", "messages": [{"role": "user", "content": "x" * 5000}]}
    r = await proxy.client.post("/v1/chat/completions", json=big)
    message = assert_envelope(r, 413, "request_too_large")
    assert "4096" in message


async def test_chunked_body_over_the_limit_is_413(
    proxy: InProcessProxy, sim_upstream: SimUpstream
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "sim-model", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    r = await proxy.client.post("/v1/chat/completions", content=chunks())
    assert_envelope(r, 413, "request_too_large")
    assert sim_upstream.chat_requests() == []


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic k1", "Bearer k1x", "bearer"])
async def test_missing_or_wrong_key_is_401(
    app_proxy: StartApp, sim_upstream: SimUpstream, auth: str | None
) -> None:
    proxy = await app_proxy(tokenizer="approx", api_keys="k1")
    headers = {"Authorization": auth} if auth else {}
    r = await proxy.client.post("/v1/chat/completions", json=HELLO, headers=headers)
    assert_envelope(r, 401, "invalid_api_key")
    assert r.json()["error"]["type"] == "authentication_error"
    assert (await proxy.client.get("/v1/models", headers=headers)).status_code == 401
    # Own routes stay open for probes and scrapers.
    assert (await proxy.client.get("/healthz")).status_code == 200
    assert [r for r in sim_upstream.requests() if r["path"] != "/metrics"] == []


async def test_too_many_in_flight_is_429_with_retry_after(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", max_in_flight=1)
    sim_upstream.configure(delay_seconds=1.5)
    slow = asyncio.create_task(proxy.client.post("/v1/chat/completions", json=HELLO))
    deadline = time.monotonic() + 5
    while not sim_upstream.chat_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # the sim answers from its own thread
    assert sim_upstream.chat_requests(), "the first request never reached the upstream"
    r = await proxy.client.post("/v1/chat/completions", json=HELLO)
    assert_envelope(r, 429, "overloaded")
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert (await slow).status_code == 200


async def test_unreachable_upstream_is_502(app_proxy: StartApp) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = await app_proxy(upstream=dead, tokenizer="approx", context_window=4096)
    r = await proxy.client.post("/v1/chat/completions", json=HELLO)
    message = assert_envelope(r, 502, "upstream_unavailable")
    assert dead in message
    assert r.json()["error"]["type"] == "upstream_error"
    assert (await proxy.client.get("/v1/models")).status_code == 502


async def test_upstream_timeout_is_504(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    proxy = await app_proxy(tokenizer="approx", read_timeout=0.5, context_window=4096)
    sim_upstream.configure(delay_seconds=3)
    r = await proxy.client.post("/v1/chat/completions", json=HELLO, timeout=10)
    message = assert_envelope(r, 504, "upstream_timeout")
    assert "0.5" in message


async def test_vllm_error_body_passes_through_as_sent(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm", max_model_len=64)
    # The operator claims a larger window than the server has: the server refuses.
    proxy = await app_proxy(upstream=sim, tokenizer="approx", context_window=100_000)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "word " * 300}]}
    direct = httpx.post(f"{sim.url}/v1/chat/completions", json=body)
    r = await proxy.client.post("/v1/chat/completions", json=body)
    assert r.status_code == direct.status_code == 400
    assert r.json() == direct.json()
    assert "maximum context length" in r.json()["error"]["message"]


async def test_fastchat_error_body_passes_through_as_sent(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("fastchat", max_model_len=64)
    proxy = await app_proxy(upstream=sim, tokenizer="approx", context_window=100_000)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "word " * 300}]}
    r = await proxy.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["object"] == "error" and r.json()["code"] == 40303


async def test_upstream_500_passes_through(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    proxy = await app_proxy(tokenizer="approx", context_window=4096)
    sim_upstream.configure(fail_next={"status": 500, "body": {"error": {"message": "boom"}}})
    r = await proxy.client.post("/v1/chat/completions", json=HELLO)
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "boom"}}


async def test_unknown_route_is_an_envelope(proxy: InProcessProxy) -> None:
    r = await proxy.client.get("/nowhere")
    assert_envelope(r, 404, "not_found")
