"""Two proxy replicas sharing one real Redis: one view of every session.

The replicas are two apps in this process (each with its own upstream client, store
client and metrics, as two processes would have); the concurrency and restart tests
run real processes.

What the upstream received is the proof that a reset took effect: after it, the
forwarded prompt is the system message plus the latest user turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.sessions.helpers import chat_body, conversation, metric_value
from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.processes import ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream

pytestmark = pytest.mark.redis

SESSION = {"x-session-id": "chat-1"}


def settings(redis_server: RedisServer, **extra: Any) -> dict[str, Any]:
    return {"tokenizer": "approx", "session_max_turns": 3, "redis_url": redis_server.url, **extra}


async def replicas(
    app_proxy: StartApp, redis_server: RedisServer, n: int = 2, **extra: Any
) -> list[InProcessProxy]:
    return [await app_proxy(**settings(redis_server, **extra)) for _ in range(n)]


async def post(proxy: InProcessProxy, users: int) -> httpx.Response:
    response = await proxy.client.post(
        "/v1/chat/completions", json=chat_body(users), headers=SESSION
    )
    assert response.status_code == 200, response.text
    return response


def post_process(proxy: ProxyProcess, users: int) -> httpx.Response:
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions", json=chat_body(users), headers=SESSION, timeout=10
    )
    assert response.status_code == 200, response.text
    return response


def turn_of(response: httpx.Response) -> tuple[str | None, str | None]:
    return (
        response.headers.get("x-trimproxy-session-turn"),
        response.headers.get("x-trimproxy-session-reset"),
    )


async def resets(proxies: list[InProcessProxy]) -> float:
    return await metric_sum(
        proxies, "trimproxy_session_limit_total", reason="turns", action="reset"
    )


async def metric_sum(proxies: list[InProcessProxy], name: str, **labels: str) -> float:
    return sum([metric_value(await p.metrics_text(), name, **labels) for p in proxies])


def forwarded(sim: SimUpstream) -> list[list[dict[str, Any]]]:
    return [r["json"]["messages"] for r in sim.chat_requests()]


def after_reset(users: int, since: int) -> list[dict[str, Any]]:
    """The forwarded messages of request ``users`` when the session reset at ``since``."""
    full = conversation(users)
    user_at = [i for i, m in enumerate(full) if m["role"] == "user"]
    return [full[0], *full[user_at[since - 1] :]]


async def test_turns_sent_alternately_to_two_replicas_count_in_one_session(
    app_proxy: StartApp,
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
) -> None:
    a, b = await replicas(app_proxy, redis_server)
    answers = [await post((a, b)[i % 2], users) for i, users in enumerate(range(1, 9))]
    assert [turn_of(r) for r in answers] == [
        ("1", None), ("2", None), ("3", None), ("1", "1"),
        ("2", None), ("3", None), ("1", "1"), ("2", None),
    ]  # fmt: skip
    assert {r.headers["x-trimproxy-session-id"] for r in answers} == {"chat-1"}
    sent = forwarded(sim_upstream)
    assert sent[:3] == [conversation(u) for u in (1, 2, 3)]
    assert sent[3] == after_reset(4, since=4)
    assert len(sent[3]) == 2  # system + the latest user turn
    assert sent[4:6] == [after_reset(5, since=4), after_reset(6, since=4)]
    assert sent[6:] == [after_reset(7, since=7), after_reset(8, since=7)]
    limits = await metric_sum(
        [a, b], "trimproxy_session_limit_total", reason="turns", action="reset"
    )
    assert limits == 2


async def test_forty_concurrent_requests_over_two_replicas_reset_once(
    proxy_server: Callable[..., ProxyProcess],
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
) -> None:
    # Real processes: two replicas that really run at once, each with its own event
    # loop; in one test process 80 requests would share one loop and the store's
    # 0.5 s deadline would measure that loop, not Redis.
    a, b = (proxy_server(**settings(redis_server)) for _ in range(2))
    async with httpx.AsyncClient(timeout=20) as client:

        async def burst(users: int) -> list[httpx.Response]:
            sends = [
                client.post(
                    f"{(a, b)[i % 2].url}/v1/chat/completions",
                    json=chat_body(users),
                    headers=SESSION,
                )
                for i in range(40)
            ]
            return list(await asyncio.gather(*sends))

        for users, since in ((4, 4), (7, 7)):  # two limit crossings
            sim_upstream.clear()
            answers = await burst(users)
            assert {r.status_code for r in answers} == {200}
            assert [turn_of(r) for r in answers].count(("1", "1")) == 1
            assert {r.headers["x-trimproxy-session-turn"] for r in answers} == {"1"}
            sent = forwarded(sim_upstream)
            assert len(sent) == 40 and all(m == after_reset(users, since) for m in sent)
        texts = [(await client.get(f"{p.url}/metrics")).text for p in (a, b)]
    name = "trimproxy_session_limit_total"
    assert sum(metric_value(t, name, reason="turns", action="reset") for t in texts) == 2


def test_restarting_a_replica_loses_no_session_state(
    proxy_server: Callable[..., ProxyProcess],
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
) -> None:
    # Real processes: a stopped replica is one whose process is gone.
    a, b = (proxy_server(**settings(redis_server)) for _ in range(2))
    for users in range(1, 5):
        post_process(a, users)
    a.stop()
    c = proxy_server(**settings(redis_server))
    sim_upstream.clear()
    assert turn_of(post_process(c, 5)) == ("2", None)
    assert turn_of(post_process(b, 6)) == ("3", None)
    assert turn_of(post_process(c, 7)) == ("1", "1")
    assert forwarded(sim_upstream) == [
        after_reset(5, since=4),
        after_reset(6, since=4),
        after_reset(7, since=7),
    ]


async def test_redis_outage_serves_without_limits_then_limits_return(
    app_proxy: StartApp,
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trimproxy.sessions")
    a, b = await replicas(app_proxy, redis_server)
    assert turn_of(await post(a, 4)) == ("1", "1")
    redis_server.stop()
    sim_upstream.clear()
    down = [await post((a, b)[i % 2], 5) for i in range(10)]
    # Open: served, trimmed by budget only (nothing to trim here), no turn known.
    assert {r.headers["x-trimproxy-session-id"] for r in down} == {"chat-1"}
    assert all("x-trimproxy-session-turn" not in r.headers for r in down)
    assert forwarded(sim_upstream) == [conversation(5)] * 10
    assert await metric_sum([a, b], "trimproxy_session_store_errors_total") == 10
    # Logged once per outage per replica, not once per request.
    assert sum("unavailable (" in m for m in caplog.messages) == 2, caplog.messages

    redis_server.start()  # empty: it ran without persistence
    for _ in range(30):  # the store tries Redis again a second after its last failure
        answer = await post(a, 6)
        if "x-trimproxy-session-turn" in answer.headers:
            break
        await asyncio.sleep(0.1)
    assert turn_of(answer) == ("1", "1")  # turn 6 > 3: limits apply again
    assert forwarded(sim_upstream)[-1] == after_reset(6, since=6)
    for _ in range(30):  # b tries again a second after its own last failure
        answer = await post(b, 7)
        if "x-trimproxy-session-turn" in answer.headers:
            break
        await asyncio.sleep(0.1)
    assert turn_of(answer) == ("2", None)  # b sees the reset a made


async def test_closed_policy_answers_503_without_redis(
    app_proxy: StartApp,
    redis_server: RedisServer,
    sim_upstream: SimUpstream,
) -> None:
    (proxy,) = await replicas(app_proxy, redis_server, n=1, session_store_failure="closed")
    await post(proxy, 1)
    redis_server.stop()
    sim_upstream.clear()
    answer = await proxy.client.post("/v1/chat/completions", json=chat_body(2), headers=SESSION)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert error["code"] == "session_store_unavailable"
    assert "TRIMPROXY_SESSION_STORE_FAILURE=closed" in error["message"]
    assert "127.0.0.1" not in error["message"]  # no addresses in answers
    assert sim_upstream.chat_requests() == []
