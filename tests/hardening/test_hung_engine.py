"""Counting with the engine's ``/tokenize`` (``TRIMPROXY_TOKENIZER=upstream``) when the
engine hangs, and when a request holds thousands of messages it never saw.

A hung engine costs a request one read timeout, not one for the count and one more
for the answer: the count's calls share the read timeout, the answer gets what is
left of it, and the 504 says that the count took it. The counts that come next go to
the local estimate without asking for a while. And one request never turns into
thousands of ``/tokenize`` calls at the engine: a count makes ``MAX_CALLS`` at most.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from proxy.tokens.vllm import MAX_CALLS, NEW_MESSAGES
from tests.hardening.raw import CHAT, HELLO, request
from tests.observability.promtext import scrape
from tests.support.bad_upstream import BadUpstream
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
StartSim = Callable[..., SimUpstream]
pytestmark = pytest.mark.xdist_group("bad_upstream")


def fallbacks(proxy: ProxyProcess, reason: str) -> float:
    return scrape(proxy.url).value("trimproxy_token_count_fallbacks_total", reason=reason)


def test_a_hung_engine_costs_one_read_timeout_and_the_504_says_what_took_it(
    proxy_server: StartProxy, bad_upstream: BadUpstream
) -> None:
    proxy = proxy_server(
        upstream=bad_upstream.url,
        tokenizer="upstream",
        context_window=4096,
        read_timeout=2,
        upstream_metrics_interval=0,
    )
    bad_upstream.behave("hang")  # from now on the engine reads every request and answers none
    bad_upstream.requests.clear()

    first = request(proxy.url, "POST", CHAT, HELLO)
    assert first.status == 504, first.body
    assert first.error_code == "upstream_timeout"
    message = first.json()["error"]["message"]
    assert "TRIMPROXY_READ_TIMEOUT" in message and "POST /tokenize" in message, message
    assert "within 2 s" in message and "counting the prompt included" in message
    # The count took the whole read timeout: the request itself was never sent, so
    # no second read timeout was waited for.
    assert bad_upstream.paths().count(CHAT) == 0, bad_upstream.paths()
    assert 1 <= bad_upstream.paths().count("/tokenize") <= MAX_CALLS
    assert fallbacks(proxy, "timeout") == 1

    # The next request is counted by the estimate at once (the engine is not asked
    # again so soon) and waits the read timeout for the answer alone.
    asked = bad_upstream.paths().count("/tokenize")
    second = request(proxy.url, "POST", CHAT, HELLO)
    assert second.status == 504, second.body
    message = second.json()["error"]["message"]
    assert "sent nothing for 2 s (TRIMPROXY_READ_TIMEOUT)" in message, message
    assert bad_upstream.paths().count("/tokenize") == asked
    assert bad_upstream.paths().count(CHAT) == 1
    assert fallbacks(proxy, "timeout") == 2
    assert "counting by estimate for the next" in proxy.logs()


def test_a_stopped_engine_process_costs_one_read_timeout(
    proxy_server: StartProxy, sim_process: SimUpstream
) -> None:
    """The operator's probe: a real engine process, SIGSTOPped. Its 504 says that the
    count with its /tokenize took the read timeout, and nothing more was waited for."""
    proxy = proxy_server(
        upstream=sim_process, tokenizer="upstream", read_timeout=2, upstream_metrics_interval=0
    )
    sim_process.process.send_signal(signal.SIGSTOP)
    try:
        answer = request(proxy.url, "POST", CHAT, {**HELLO, "model": "sim-model"})
    finally:
        sim_process.process.send_signal(signal.SIGCONT)
    assert answer.status == 504, answer.body
    message = answer.json()["error"]["message"]
    assert "within 2 s (TRIMPROXY_READ_TIMEOUT), counting the prompt included" in message
    assert fallbacks(proxy, "timeout") == 1


def test_a_slow_count_leaves_the_answer_only_what_is_left_of_the_read_timeout(
    proxy_server: StartProxy, bad_upstream: BadUpstream
) -> None:
    """``/tokenize`` answers, slowly (1.2 s of the 2 s read timeout); the engine then
    never answers the chat request. Its 504 comes when the one read timeout is spent
    in all, and says that the count took part of it."""
    proxy = proxy_server(
        upstream=bad_upstream.url,
        tokenizer="upstream",
        context_window=4096,
        read_timeout=2,
        upstream_metrics_interval=0,
    )
    bad_upstream.behave("ok", path="/tokenize", delay=1.2)
    bad_upstream.behave("hang", path=CHAT)
    answer = request(proxy.url, "POST", CHAT, HELLO)
    assert answer.status == 504, answer.body
    message = answer.json()["error"]["message"]
    assert "within 2 s (TRIMPROXY_READ_TIMEOUT), counting the prompt included" in message
    assert fallbacks(proxy, "timeout") == 0  # the count itself was exact


def test_thousands_of_new_messages_cost_a_bounded_number_of_tokenize_calls(
    proxy_server: StartProxy, sim_upstream_factory: StartSim
) -> None:
    sim = sim_upstream_factory(max_model_len=1_000_000)
    proxy = proxy_server(upstream=sim, tokenizer="upstream", upstream_metrics_interval=0)
    sim.clear()
    many = 3000
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} never seen"}
        for i in range(many)
    ]
    answer = request(proxy.url, "POST", CHAT, {"model": "sim-model", "messages": messages})
    assert answer.status == 200, answer.body
    assert answer.headers["x-trimproxy-trimmed-messages"] == "0"
    calls = len(sim.requests("/tokenize"))
    assert 1 <= calls <= MAX_CALLS, calls
    assert fallbacks(proxy, "bound") == 1
    # The total is still the engine's own count: what the proxy counted is what the
    # engine then reported as the prompt's tokens.
    forwarded = int(answer.headers["x-trimproxy-prompt-tokens"])
    assert forwarded == answer.json()["usage"]["prompt_tokens"]

    # A conversation whose new messages are at most the bound has each counted alone:
    # the total, and one call per new message (the roles' constants are known now).
    short = messages[:10]
    request(proxy.url, "POST", CHAT, {"model": "sim-model", "messages": short})
    sim.clear()
    turn = [*short, *({"role": "user", "content": f"new {i}"} for i in range(NEW_MESSAGES))]
    answer = request(proxy.url, "POST", CHAT, {"model": "sim-model", "messages": turn})
    assert answer.status == 200, answer.body
    assert len(sim.requests("/tokenize")) == 1 + NEW_MESSAGES
    assert fallbacks(proxy, "bound") == 1
