"""The shared fixtures end to end: ``proxy_server`` (a real ``trimproxy serve``) and
``app_proxy`` (the app in-process) in front of the session sim, as the suites use them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.inprocess import StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


def test_proxy_server_forwards_to_the_sim(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx")
    answer = httpx.post(proxy.url + CHAT, json=BODY, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 16
    (record,) = sim_upstream.chat_requests()
    assert record["json"] == BODY
    assert proxy.process.poll() is None
    assert isinstance(proxy.logs(), str)


def test_upstream_sees_a_client_leave_within_1_5_s(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    """A streaming client that goes away mid-answer: the proxy closes its upstream
    request, and the sim (vLLM would abort and free the KV blocks) notices quickly."""
    sim_upstream.configure(tokens_per_second=5, completion_tokens=200)
    proxy = proxy_server(tokenizer="approx")
    body: dict[str, Any] = {**BODY, "stream": True}
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", proxy.url + CHAT, json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: closing this iterator would close the connection
        next(lines)  # the first chunk arrived: the upstream is generating
        sim_upstream.wait_for_state(lambda s: s["running"] == 1 and s["kv_used_blocks"] > 0)
    # The client's connection is closed here. Waited on, not timed: the proof that the
    # proxy passed the disconnect on is the sim's record of it, 40 s before the end.
    state = sim_upstream.wait_for_state(lambda s: s["running"] == 0, timeout=30.0)
    assert state["disconnects"] == 1 and state["kv_used_blocks"] == 0
    (record,) = sim_upstream.chat_requests()
    assert record["disconnected"] is True and record["completion_tokens"] < 200


async def test_app_proxy_runs_the_app_in_process_against_the_sim(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    # The lifespan ran: the services are built and the upstream answers.
    assert (await proxy.client.get("/readyz")).status_code == 200
    answer = await proxy.client.post(CHAT, json=BODY)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-trimproxy-prompt-tokens"].isdigit()
    (record,) = sim_upstream.chat_requests()
    assert record["json"] == BODY
    text = await proxy.metrics_text()
    assert 'trimproxy_requests_total{code="200",route="/v1/chat/completions"} 1.0' in text


def test_the_sim_runs_in_a_thread_or_as_a_process(
    sim_upstream: SimUpstream, sim_process: SimUpstream
) -> None:
    for sim in (sim_upstream, sim_process):
        assert httpx.get(sim.url + "/health", timeout=10).status_code == 200
    assert sim_process.process.poll() is None
    with pytest.raises(AttributeError):
        _ = sim_upstream.process  # a thread of this process has no child of its own
