"""Readiness and the model list follow what every request needs.

``/readyz`` is not ready while every chat request would be refused: the session
store or the KV admission ledger (real Redis) is down and
``TRIMPROXY_SESSION_STORE_FAILURE=closed``; ready again once it is back. With
``open`` the proxy serves without the store and stays ready.
``GET /v1/models`` with every engine down is the 503 ``no_engine_available`` with
``Retry-After`` that chat answers, not a 502 naming the first engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.hardening.raw import Answer, request
from tests.support.processes import ProxyProcess, free_port
from tests.support.redis_server import RedisServer

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"
HELLO: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
SESSIONS: dict[str, Any] = {"tokenizer": "approx", "session_max_turns": 50}


def ready_when(proxy: ProxyProcess, status: int, guard: float = 30.0) -> Answer:
    """``/readyz`` once it answers ``status`` (a hang guard, not a measure)."""
    deadline = time.monotonic() + guard
    while True:
        answer = request(proxy.url, "GET", "/readyz")
        if answer.status == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def not_ready_while_redis_is_down(proxy: ProxyProcess, redis: RedisServer, names: str) -> None:
    """Ready; not ready while Redis is down, the detail naming ``names``, the setting
    and ``TRIMPROXY_REDIS_URL``, and a request refused as readiness said; ready again
    and served once Redis is back."""
    assert request(proxy.url, "POST", CHAT, HELLO).status == 200
    assert request(proxy.url, "GET", "/readyz").status == 200
    redis.stop()
    down = ready_when(proxy, 503)
    assert down.status == 503, down.body
    body = down.json()
    assert body["status"] == "not ready" and body["upstream_ready"] is True
    for named in (names, "TRIMPROXY_SESSION_STORE_FAILURE=closed", "TRIMPROXY_REDIS_URL"):
        assert named in body["detail"], body
    # What readiness says is what a request meets.
    refused = request(proxy.url, "POST", CHAT, HELLO)
    assert refused.status == 503 and refused.error_code == "session_store_unavailable"

    redis.start()  # the same port
    back = ready_when(proxy, 200)
    assert back.status == 200, back.body
    assert request(proxy.url, "POST", CHAT, HELLO).status == 200


@pytest.mark.redis
def test_readyz_is_not_ready_while_a_closed_session_store_is_down(
    proxy_server: StartProxy, redis_server: RedisServer
) -> None:
    proxy = proxy_server(redis_url=redis_server.url, session_store_failure="closed", **SESSIONS)
    not_ready_while_redis_is_down(proxy, redis_server, "session store")


@pytest.mark.redis
def test_readyz_is_not_ready_while_a_closed_kv_ledger_is_down(
    proxy_server: StartProxy, redis_server: RedisServer
) -> None:
    """No session limits: Redis holds only the KV admission ledger."""
    proxy = proxy_server(
        redis_url=redis_server.url,
        session_store_failure="closed",
        tokenizer="approx",
        kv_admission="100000",
    )
    not_ready_while_redis_is_down(proxy, redis_server, "KV admission ledger")


@pytest.mark.redis
def test_readyz_stays_ready_when_an_open_session_store_is_down(
    proxy_server: StartProxy, redis_server: RedisServer
) -> None:
    proxy = proxy_server(redis_url=redis_server.url, session_store_failure="open", **SESSIONS)
    redis_server.stop()
    assert request(proxy.url, "POST", CHAT, HELLO).status == 200  # served, unchecked
    assert request(proxy.url, "GET", "/readyz").status == 200


def test_the_model_list_with_every_engine_down_is_503_no_engine_available(
    proxy_server: StartProxy,
) -> None:
    down = ",".join(f"http://127.0.0.1:{free_port()}" for _ in range(2))
    proxy = proxy_server(upstream=down, tokenizer="approx", context_window=4096)
    models = request(proxy.url, "GET", "/v1/models")
    assert models.status == 503, models.body
    assert models.error_code == "no_engine_available"
    assert int(models.headers["retry-after"]) >= 1
    chat = request(proxy.url, "POST", CHAT, HELLO)
    assert (chat.status, chat.error_code) == (503, "no_engine_available")
