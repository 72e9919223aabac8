"""An engine that closes the connection before answering: a kept-alive connection it
was just closing, or an engine that died while answering a non-streamed request.

Nothing of the answer came, so nothing is lost by sending the request again: once on
a fresh connection to the same engine (``proxy.upstream.resend``, counted in
``trimproxy_upstream_retries_total``), never a third time; then, when the engine
refuses or drops that too and another engine is there, on the next one
(``proxy.upstream.failover``). What is answered otherwise says that the engine
closed the connection mid-answer, not that it could not be reached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.hardening.raw import CHAT, HELLO, request
from tests.observability.promtext import scrape
from tests.support.bad_upstream import BadUpstream
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
StartSim = Callable[..., SimUpstream]
pytestmark = pytest.mark.xdist_group("bad_upstream")

SETTINGS: dict[str, Any] = {
    "tokenizer": "approx",
    "context_window": 4096,
    "upstream_metrics_interval": 0,
}


def retries(proxy: ProxyProcess) -> float:
    return scrape(proxy.url).value("trimproxy_upstream_retries_total", reason="disconnected")


def chat_posts(bad: BadUpstream) -> int:
    return bad.paths().count(CHAT)


def test_a_post_on_a_kept_alive_connection_the_engine_closes_is_sent_once_more(
    proxy_server: StartProxy, bad_upstream: BadUpstream
) -> None:
    """Every connection answers its first request and closes on the next one it
    reads: each request that goes out on a kept-alive connection meets the race, and
    is answered from a fresh connection."""
    bad_upstream.behave("close_reused")
    proxy = proxy_server(upstream=bad_upstream.url, **SETTINGS)
    for _ in range(4):
        answer = request(proxy.url, "POST", CHAT, HELLO)
        assert answer.status == 200, answer.body
    again = retries(proxy)
    assert again >= 1  # at least one request met a connection the engine closed
    # Each retry is one more POST at the engine, and no request went out more often.
    assert chat_posts(bad_upstream) == 4 + again


def test_an_engine_that_drops_every_request_is_tried_twice_then_named(
    proxy_server: StartProxy, bad_upstream: BadUpstream
) -> None:
    proxy = proxy_server(upstream=bad_upstream.url, **SETTINGS)
    bad_upstream.behave("drop", path=CHAT)
    answer = request(proxy.url, "POST", CHAT, HELLO)
    assert answer.status == 502, answer.body
    assert answer.error_code == "upstream_unavailable"
    message = answer.json()["error"]["message"]
    assert "closed the connection mid-answer" in message, message
    assert "again on a fresh connection" in message and "could not be reached" not in message
    assert chat_posts(bad_upstream) == 2  # the request and its one retry, never a third
    assert retries(proxy) == 1


def test_an_engine_killed_while_answering_is_named_as_such(
    proxy_server: StartProxy, sim_process: SimUpstream
) -> None:
    """A real engine process, SIGKILLed while it generates a non-streamed answer: the
    connection closes with nothing answered, the one retry finds no engine, and the
    502 says the engine closed the connection mid-answer."""
    sim_process.configure(tokens_per_second=5.0, completion_tokens=2000)
    proxy = proxy_server(upstream=sim_process, **SETTINGS)
    answers: list[Any] = []
    asking = threading.Thread(
        target=lambda: answers.append(request(proxy.url, "POST", CHAT, HELLO))
    )
    asking.start()
    sim_process.wait_for_state(lambda s: s["running"] == 1, timeout=30)
    sim_process.process.kill()  # SIGKILL, mid-answer
    sim_process.process.wait()
    asking.join(60)
    assert not asking.is_alive()
    (answer,) = answers
    assert answer.status == 502, answer.body
    message = answer.json()["error"]["message"]
    assert "closed the connection mid-answer" in message, message
    assert "could not be reached" not in message
    # The retry's connection is refused, or, when it raced the dying process's
    # listening socket, accepted and dropped: either way said, and tried once.
    assert "refused a new connection" in message or "again on a fresh connection" in message
    assert retries(proxy) == 1


def test_a_request_its_engine_dropped_is_answered_by_the_next_engine(
    proxy_server: StartProxy, bad_upstream: BadUpstream, sim_upstream_factory: StartSim
) -> None:
    """Two engines; one takes requests and closes the connection without answering
    (twice: the retry on a fresh connection too). The other engine answers each."""
    good = sim_upstream_factory()
    bad_upstream.behave("drop", path=CHAT)
    proxy = proxy_server(
        upstream=f"{bad_upstream.url},{good.url}",
        routing="round_robin",
        health_interval=60,
        **SETTINGS,
    )
    for _ in range(4):
        answer = request(proxy.url, "POST", CHAT, HELLO)
        assert answer.status == 200, answer.body
    dropped = chat_posts(bad_upstream)
    assert dropped >= 2  # the dropping engine was tried: twice for each request it got
    assert len(good.chat_requests()) == 4
    assert retries(proxy) == dropped / 2
