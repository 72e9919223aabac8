"""The session step of the app (in-process): ids, keys, reject, age, headers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.sessions.helpers import chat_body, conversation, later, metric_value
from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream

STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


async def start(
    app_proxy: StartApp, request: pytest.FixtureRequest, store: str, **kw: Any
) -> InProcessProxy:
    if store == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        kw["redis_url"] = server.url
    return await app_proxy(tokenizer="approx", **kw)


async def send(
    proxy: InProcessProxy, users: int, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return await proxy.client.post(
        "/v1/chat/completions",
        json=chat_body(users, **body),
        headers=headers or {},
        timeout=10,
    )


async def wait(proxy: InProcessProxy, seconds: float) -> None:
    """``seconds`` pass for the app's session store (``helpers.later``)."""
    sessions = proxy.app.state.services.sessions
    await later(sessions.store, seconds)


def turn(response: httpx.Response) -> tuple[int, str | None, str | None]:
    return (
        response.status_code,
        response.headers.get("x-trimproxy-session-turn"),
        response.headers.get("x-trimproxy-session-reset"),
    )


async def test_no_limit_no_session_step(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    proxy = await app_proxy(tokenizer="approx")
    answer = await send(proxy, 9, {"x-session-id": "s"})
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.startswith("x-trimproxy-session")]
    assert sim_upstream.chat_requests()[0]["json"]["messages"] == conversation(9)


async def test_other_ids_and_api_keys_are_unaffected(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", session_max_turns=3, api_keys="key-1,key-2")
    one = {"authorization": "Bearer key-1", "x-session-id": "s"}
    two = {"authorization": "Bearer key-2", "x-session-id": "s"}
    other = {"authorization": "Bearer key-1", "x-session-id": "t"}
    assert turn(await send(proxy, 4, one)) == (200, "1", "1")
    assert turn(await send(proxy, 3, two)) == (200, "3", None)  # same id, other key
    assert turn(await send(proxy, 3, other)) == (200, "3", None)  # same key, other id
    assert turn(await send(proxy, 5, one)) == (200, "2", None)
    sent = [r["json"]["messages"] for r in sim_upstream.chat_requests()]
    assert sent[1] == conversation(3) and sent[2] == conversation(3)
    assert len(sent[0]) == 2 and sent[0][-1] == conversation(4)[-1]
    # The body's `user` names a session too, below the header.
    assert turn(await send(proxy, 2, {"authorization": "Bearer key-1"}, user="u")) == (
        200,
        "2",
        None,
    )
    text = (await proxy.client.get("/metrics")).text
    assert metric_value(text, "trimproxy_sessions") == 4  # (1, s), (2, s), (1, t), (1, u)


async def test_conversations_sharing_a_fingerprint_do_not_move_each_others_reset(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", session_max_turns=3)
    first = await send(proxy, 4, tag="a")
    assert turn(first) == (200, "1", "1")
    other = await send(proxy, 3, tag="b")  # same system + first message, different history
    assert other.headers["x-trimproxy-session-id"] == first.headers["x-trimproxy-session-id"]
    assert first.headers["x-trimproxy-session-id"].startswith("fp-")
    assert turn(other) == (200, "3", None)
    assert turn(await send(proxy, 5, tag="a")) == (200, "2", None)
    sent = [r["json"]["messages"] for r in sim_upstream.chat_requests()]
    assert sent[1] == conversation(3, tag="b")  # b's history intact
    assert sent[2] == [conversation(5)[0], *conversation(5)[-3:]]  # a still from its reset


@pytest.mark.parametrize("store", STORES)
async def test_reject_on_turns(
    app_proxy: StartApp,
    sim_upstream: SimUpstream,
    request: pytest.FixtureRequest,
    store: str,
) -> None:
    proxy = await start(
        app_proxy, request, store, session_max_turns=3, session_limit_action="reject"
    )
    assert turn(await send(proxy, 3, {"x-session-id": "s"})) == (200, "3", None)
    sim_upstream.clear()
    refused = await send(proxy, 4, {"x-session-id": "s"})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "session_turn_limit",
        "invalid_request_error",
        "messages",
    )
    assert "limit of 3 turns" in error["message"] and "new conversation" in error["message"]
    assert refused.headers["x-trimproxy-session-id"] == "s"
    assert sim_upstream.chat_requests() == []
    assert turn(await send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    text = await proxy.metrics_text()
    assert metric_value(text, "trimproxy_session_limit_total", reason="turns", action="reject") == 1


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("action", ["reset", "reject"])
async def test_age_limit(
    app_proxy: StartApp,
    sim_upstream: SimUpstream,
    request: pytest.FixtureRequest,
    store: str,
    action: str,
) -> None:
    proxy = await start(app_proxy, request, store, session_max_age=1, session_limit_action=action)
    assert turn(await send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    assert turn(await send(proxy, 2, {"x-session-id": "s"})) == (200, "2", None)
    await wait(proxy, 1.1)
    sim_upstream.clear()
    late = await send(proxy, 3, {"x-session-id": "s"})
    if action == "reset":
        assert turn(late) == (200, "1", "1")
        assert sim_upstream.chat_requests()[0]["json"]["messages"] == [
            conversation(3)[0],
            conversation(3)[-1],
        ]
        assert turn(await send(proxy, 4, {"x-session-id": "s"})) == (200, "2", None)
    else:
        assert late.status_code == 409
        error = late.json()["error"]
        assert error["code"] == "session_expired"
        assert "limit of 1 s" in error["message"]
        assert sim_upstream.chat_requests() == []
        assert turn(await send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    text = await proxy.metrics_text()
    assert metric_value(text, "trimproxy_session_limit_total", reason="age", action=action) == 1


async def test_streaming_answers_carry_the_session_headers(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", session_max_turns=3)
    async with proxy.client.stream(
        "POST",
        "/v1/chat/completions",
        json=chat_body(4, stream=True),
        headers={"x-session-id": "s"},
    ) as answer:
        chunks = [line async for line in answer.aiter_lines() if line.startswith("data:")]
    assert turn(answer) == (200, "1", "1")
    assert chunks[-1] == "data: [DONE]"
    assert sim_upstream.chat_requests()[0]["json"]["messages"] == [
        conversation(4)[0],
        conversation(4)[-1],
    ]
