"""The session step of a real proxy process: ids, keys, reject, age, headers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import ProxyProcess, SimUpstream
from tests.sessions.helpers import chat_body, conversation, metric_value
from tests.sessions.redis_server import RedisServer

STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


def start(
    proxy_server: Callable[..., ProxyProcess], request: pytest.FixtureRequest, store: str, **kw: Any
) -> ProxyProcess:
    if store == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        kw["redis_url"] = server.url
    return proxy_server(tokenizer="approx", **kw)


def send(
    proxy: ProxyProcess, users: int, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json=chat_body(users, **body),
        headers=headers or {},
        timeout=10,
    )


def turn(response: httpx.Response) -> tuple[int, str | None, str | None]:
    return (
        response.status_code,
        response.headers.get("x-trimproxy-session-turn"),
        response.headers.get("x-trimproxy-session-reset"),
    )


def test_no_limit_no_session_step(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx")
    answer = send(proxy, 9, {"x-session-id": "s"})
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.startswith("x-trimproxy-session")]
    assert sim_upstream.chat_requests()[0]["json"]["messages"] == conversation(9)


def test_other_ids_and_api_keys_are_unaffected(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", session_max_turns=3, api_keys="key-1,key-2")
    one = {"authorization": "Bearer key-1", "x-session-id": "s"}
    two = {"authorization": "Bearer key-2", "x-session-id": "s"}
    other = {"authorization": "Bearer key-1", "x-session-id": "t"}
    assert turn(send(proxy, 4, one)) == (200, "1", "1")
    assert turn(send(proxy, 3, two)) == (200, "3", None)  # same id, other key
    assert turn(send(proxy, 3, other)) == (200, "3", None)  # same key, other id
    assert turn(send(proxy, 5, one)) == (200, "2", None)
    sent = [r["json"]["messages"] for r in sim_upstream.chat_requests()]
    assert sent[1] == conversation(3) and sent[2] == conversation(3)
    assert len(sent[0]) == 2 and sent[0][-1] == conversation(4)[-1]
    # The body's `user` names a session too, below the header.
    assert turn(send(proxy, 2, {"authorization": "Bearer key-1"}, user="u")) == (200, "2", None)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert metric_value(text, "trimproxy_sessions") == 4  # (1, s), (2, s), (1, t), (1, u)


def test_conversations_sharing_a_fingerprint_do_not_move_each_others_reset(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", session_max_turns=3)
    first = send(proxy, 4, tag="a")
    assert turn(first) == (200, "1", "1")
    other = send(proxy, 3, tag="b")  # same system + first message, different history
    assert other.headers["x-trimproxy-session-id"] == first.headers["x-trimproxy-session-id"]
    assert first.headers["x-trimproxy-session-id"].startswith("fp-")
    assert turn(other) == (200, "3", None)
    assert turn(send(proxy, 5, tag="a")) == (200, "2", None)
    sent = [r["json"]["messages"] for r in sim_upstream.chat_requests()]
    assert sent[1] == conversation(3, tag="b")  # b's history intact
    assert sent[2] == [conversation(5)[0], *conversation(5)[-3:]]  # a still from its reset


@pytest.mark.parametrize("store", STORES)
def test_reject_on_turns(
    proxy_server: Callable[..., ProxyProcess],
    sim_upstream: SimUpstream,
    request: pytest.FixtureRequest,
    store: str,
) -> None:
    proxy = start(proxy_server, request, store, session_max_turns=3, session_limit_action="reject")
    assert turn(send(proxy, 3, {"x-session-id": "s"})) == (200, "3", None)
    sim_upstream.clear()
    refused = send(proxy, 4, {"x-session-id": "s"})
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
    assert turn(send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert metric_value(text, "trimproxy_session_limit_total", reason="turns", action="reject") == 1


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("action", ["reset", "reject"])
def test_age_limit(
    proxy_server: Callable[..., ProxyProcess],
    sim_upstream: SimUpstream,
    request: pytest.FixtureRequest,
    store: str,
    action: str,
) -> None:
    proxy = start(proxy_server, request, store, session_max_age=1, session_limit_action=action)
    assert turn(send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    assert turn(send(proxy, 2, {"x-session-id": "s"})) == (200, "2", None)
    time.sleep(1.1)
    sim_upstream.clear()
    late = send(proxy, 3, {"x-session-id": "s"})
    if action == "reset":
        assert turn(late) == (200, "1", "1")
        assert sim_upstream.chat_requests()[0]["json"]["messages"] == [
            conversation(3)[0],
            conversation(3)[-1],
        ]
        assert turn(send(proxy, 4, {"x-session-id": "s"})) == (200, "2", None)
    else:
        assert late.status_code == 409
        error = late.json()["error"]
        assert error["code"] == "session_expired"
        assert "limit of 1 s" in error["message"]
        assert sim_upstream.chat_requests() == []
        assert turn(send(proxy, 1, {"x-session-id": "s"})) == (200, "1", None)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert metric_value(text, "trimproxy_session_limit_total", reason="age", action=action) == 1


def test_streaming_answers_carry_the_session_headers(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx", session_max_turns=3)
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/chat/completions",
        json=chat_body(4, stream=True),
        headers={"x-session-id": "s"},
        timeout=10,
    ) as answer:
        chunks = [line for line in answer.iter_lines() if line.startswith("data:")]
    assert turn(answer) == (200, "1", "1")
    assert chunks[-1] == "data: [DONE]"
    assert sim_upstream.chat_requests()[0]["json"]["messages"] == [
        conversation(4)[0],
        conversation(4)[-1],
    ]
