"""The Responses WebSocket through a real ``trimproxy serve`` in front of the simulated
engine, driven by the ``websockets`` client as the Codex CLI frames it: each
``response.create`` gets what an HTTP request gets, its events relayed as messages."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.compaction.helpers import agent_input, compaction_items, sent_bodies, types_of
from tests.conftest import StartProxy, StartSim
from tests.sessions.helpers import metric_value
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

BUDGET = 3000
KEY = {"Authorization": "Bearer key-a"}


def start(proxy_server: StartProxy, **extra: object) -> ProxyProcess:
    return proxy_server(
        tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0, **extra
    )


def ws_url(proxy: ProxyProcess) -> str:
    return proxy.url.replace("http://", "ws://") + "/v1/responses"


def create(ws: ClientConnection, **request: Any) -> list[dict[str, Any]]:
    """One ``response.create``: every event until the response ends or an error."""
    ws.send(json.dumps({"type": "response.create", "model": "sim-model", **request}))
    events = []
    while True:
        event = json.loads(ws.recv(timeout=30))
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "error"):
            return events


def test_a_codex_session_over_the_socket(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    history = agent_input(5)
    with connect(ws_url(proxy), additional_headers=KEY) as ws:
        # Warm-up: answered without the engine, remembered as the last response.
        warm = create(ws, input=history, generate=False, store=False)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert sim_upstream.requests("/v1/responses") == []
        # The next turn names it: the connection expands it, though store was false.
        new = {"type": "message", "role": "user", "content": "Go on."}
        first = create(
            ws, input=[new], previous_response_id=warm[-1]["response"]["id"], store=False
        )
        assert first[0]["type"] == "response.created"
        assert any(e["type"] == "response.output_text.delta" for e in first)
        assert first[-1]["type"] == "response.completed"
        (body,) = sent_bodies(sim_upstream)
        assert types_of(body["input"]) == [*types_of(history), "message"]
        # Codex's remote compaction: exactly one compaction item.
        trigger = create(ws, input=[*history, new, {"type": "compaction_trigger"}], store=False)
        done = [e["item"] for e in trigger if e["type"] == "response.output_item.done"]
        assert [i["type"] for i in done] == ["compaction"]
        assert len(sent_bodies(sim_upstream)) == 1  # no engine call
        # Sent back with the user's messages: expanded, never forwarded as an item.
        users = [i for i in history if i.get("role") == "user"]
        after = create(ws, input=[*users, done[0], new], store=False)
        assert after[-1]["type"] == "response.completed"
        last = sent_bodies(sim_upstream)[-1]
        assert compaction_items(last) == []
        assert len(last["input"]) == len(history) + 2
        # A refusal is an error message; the connection goes on.
        refused = create(ws, input="x", previous_response_id="resp_unknown")
        assert refused == [
            {
                "type": "error",
                "status": 400,
                "error": refused[0]["error"],
            }
        ]
        assert refused[0]["error"]["code"] == "previous_response_not_found"
        assert create(ws, input="again", store=False)[-1]["type"] == "response.completed"
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    # Every message a request of its own, counted and logged as one.
    answered = metric_value(text, "trimproxy_requests_total", route="/v1/responses", code="200")
    assert answered == 4
    assert metric_value(text, "trimproxy_compactions_total", form="trigger") == 1
    assert '"path":"/v1/responses"' in proxy.logs()


def test_the_socket_checks_the_api_key_on_every_message(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server, api_keys="key-a")
    with connect(ws_url(proxy), additional_headers={"Authorization": "Bearer wrong"}) as ws:
        (refused,) = create(ws, input="hi")
        assert refused["type"] == "error" and refused["status"] == 401
    with connect(ws_url(proxy), additional_headers=KEY) as ws:
        assert create(ws, input="hi")[-1]["type"] == "response.completed"
    assert len(sim_upstream.requests("/v1/responses")) == 1


def test_a_socket_closed_mid_answer_lets_the_engine_go(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    sim_upstream.configure(tokens_per_second=4, completion_tokens=200)
    with connect(ws_url(proxy), additional_headers=KEY) as ws:
        request = {"type": "response.create", "model": "sim-model", "input": "a long story"}
        ws.send(json.dumps({**request, "max_output_tokens": 200}))
        assert json.loads(ws.recv(timeout=30))["type"] == "response.created"
    # Waited on, not timed: the engine's request ended by the disconnect, long (50 s)
    # before its answer would have.
    sim_upstream.wait_for_state(lambda s: s["disconnects"] == 1 and s["running"] == 0, 30.0)
    (record,) = sim_upstream.requests("/v1/responses")
    assert record["disconnected"] is True


def test_a_slow_answer_keeps_the_socket_past_the_header_timeout(
    proxy_server: StartProxy, sim_upstream_factory: StartSim
) -> None:
    """The header timeout ends at the upgrade: a socket idle past it, and an engine that
    takes longer than it to answer (a long prompt's prefill), keep the connection."""
    sim = sim_upstream_factory(delay_seconds=3)
    proxy = start(proxy_server, upstream=sim, header_timeout=1)
    with connect(ws_url(proxy), additional_headers=KEY) as ws:
        time.sleep(2)
        first = create(ws, input="Hello.", store=False)
        assert first[-1]["type"] == "response.completed", first[-1]
        again = create(ws, input="And again.", store=False)
        assert again[-1]["type"] == "response.completed", again[-1]
    assert len(sim.requests("/v1/responses")) == 2
