"""The four prompt routes under a hostile client, through a real ``trimproxy serve`` in
front of the simulated engine (docs/security.md): other spellings, encoded bodies,
``n`` spelled to dodge KV admission, Messages requests the engine would answer in
OpenAI's envelope, ``store`` of the wrong type, ids echoed unbounded, turns hidden
from the session limit. Each is refused by the proxy and never reaches the engine."""

from __future__ import annotations

import gzip
import threading
from typing import Any

import orjson
import pytest

from tests.conftest import StartProxy
from tests.hardening.raw import Answer, request
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

MODEL = "sim-model"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"

BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    COMPLETIONS: {"model": MODEL, "prompt": "hi", "max_tokens": 4},
    RESPONSES: {"model": MODEL, "input": "hi", "max_output_tokens": 4, "store": False},
    MESSAGES: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    COUNT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
}
PROMPT_ROUTES = [CHAT, COMPLETIONS, RESPONSES, MESSAGES]


@pytest.fixture
def proxy(proxy_server: StartProxy) -> ProxyProcess:
    return proxy_server(tokenizer="approx", upstream_metrics_interval=0)


def engine_got(sim: SimUpstream) -> list[dict[str, Any]]:
    return [r for r in sim.requests() if r["path"] != "/v1/models"]


def refused_in_envelope(answer: Answer, path: str, status: int) -> str:
    """The error's message, after checking its status and the route's envelope."""
    assert answer.status == status, (answer.status, answer.body[:300])
    body = answer.json()
    if path.startswith(MESSAGES):
        assert body["type"] == "error", body
        message: str = body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        message = body["error"]["message"]
    return message


@pytest.mark.parametrize("path", [*PROMPT_ROUTES, COUNT])
def test_an_encoded_body_is_415_and_never_forwarded(
    path: str, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    raw = orjson.dumps(BODIES[path])
    for coding, body in (("gzip", raw), ("gzip", gzip.compress(raw)), ("br", raw)):
        answer = request(proxy.url, "POST", path, body, {"content-encoding": coding})
        assert coding in refused_in_envelope(answer, path, 415)
    assert engine_got(sim_upstream) == []
    # identity is plain: served, and the header is not passed on with the body.
    answer = request(proxy.url, "POST", path, raw, {"content-encoding": "identity"})
    assert answer.status == 200, answer.body[:300]
    for sent in engine_got(sim_upstream):
        assert "content-encoding" not in {k.lower() for k, _ in sent["headers"]}


@pytest.mark.parametrize("path", [*PROMPT_ROUTES, COUNT])
def test_another_spelling_of_a_prompt_route_is_404_and_never_relayed(
    path: str, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    for spelled in (
        f"{path};x=1",
        f"{path}%20",
        f"{path}%09",
        f"{path}!!",
        f"{path};",
        f"{path}..",
    ):
        answer = request(proxy.url, "POST", spelled, BODIES[path])
        assert path in refused_in_envelope(answer, path, 404), spelled
    assert engine_got(sim_upstream) == []


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("n", [0, -1, 1.5, "x", "2.5", [3]])
def test_an_n_the_engine_would_refuse_is_the_proxys_400(
    path: str, n: object, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    for name in ("n", "best_of"):
        answer = request(proxy.url, "POST", path, {**BODIES[path], name: n})
        assert name in refused_in_envelope(answer, path, 400)
    assert engine_got(sim_upstream) == []


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("n", ["4", 4.0])
def test_n_as_a_string_or_a_float_is_reserved_as_the_engine_runs_it(
    path: str, n: object, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    """Each request asks 4 answers of 200 tokens: 800 tokens of a 1,000-token KV
    capacity, so two cannot run at once (read as one answer each, both would)."""
    proxy = proxy_server(tokenizer="approx", kv_admission="1000", upstream_metrics_interval=0)
    sim_upstream.configure(delay_seconds=0.5, completion_tokens=4)
    body = {**BODIES[path], "n": n, "max_tokens": 200}
    answers: list[Answer] = []

    def send() -> None:
        answers.append(request(proxy.url, "POST", path, body))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status for a in answers] == [200, 200], [a.body[:200] for a in answers]
    waited = [a for a in answers if "x-trimproxy-admission-wait-ms" in a.headers]
    assert len(waited) == 1
    if path == CHAT:  # the engine ran the four it was asked
        assert all(len(a.json()["choices"]) == 4 for a in answers)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"model": None}, "model"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "text", "data": "x"}},
                            {"type": "text", "text": "summarise"},
                        ],
                    }
                ]
            },
            "messages",
        ),
    ],
    ids=["no-max-tokens", "no-model", "role-tool", "document-block"],
)
def test_a_messages_request_the_engine_cannot_serve_is_anthropics_400(
    change: dict[str, Any], param: str, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    body = {k: v for k, v in {**BODIES[MESSAGES], **change}.items() if v is not None}
    answer = request(proxy.url, "POST", MESSAGES, body)
    message = refused_in_envelope(answer, MESSAGES, 400)
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert param in message
    assert engine_got(sim_upstream) == []


@pytest.mark.parametrize("store", ["false", 0, 1, "true", [], {}])
def test_store_of_the_wrong_type_is_openais_400(
    store: object, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    answer = request(proxy.url, "POST", RESPONSES, {**BODIES[RESPONSES], "store": store})
    refused_in_envelope(answer, RESPONSES, 400)
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_type", "store")
    assert engine_got(sim_upstream) == []


def test_an_unknown_id_is_echoed_bounded_and_input_items_is_a_json_404(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    long_id = "resp_" + "x" * 100_000
    body = {**BODIES[RESPONSES], "previous_response_id": long_id}
    answer = request(proxy.url, "POST", RESPONSES, body)
    message = refused_in_envelope(answer, RESPONSES, 400)
    assert answer.json()["error"]["code"] == "previous_response_not_found"
    assert long_id[:64] + "..." in message and len(answer.body) < 2000
    got = request(proxy.url, "GET", f"{RESPONSES}/{'r' * 4000}")
    assert len(refused_in_envelope(got, RESPONSES, 404)) < 1000
    items = request(proxy.url, "GET", f"{RESPONSES}/resp_abc/input_items")
    refused_in_envelope(items, RESPONSES, 404)
    assert items.headers["content-type"].startswith("application/json")
    assert engine_got(sim_upstream) == []


def test_response_ids_are_hashed_in_the_access_log(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    made = request(proxy.url, "POST", RESPONSES, {**BODIES[RESPONSES], "store": True})
    rid = made.json()["id"]
    assert request(proxy.url, "GET", f"{RESPONSES}/{rid}").status == 200
    proxy.stop()
    logs = proxy.logs()
    assert rid not in logs
    assert f"{RESPONSES}/h:" in logs and '"response":' in logs


def _wrapped(users: int, developer: bool) -> list[dict[str, Any]]:
    """One user turn, then ``users`` more user (or developer) messages wrapped between
    a dummy call and its output."""
    role = "developer" if developer else "user"
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q0"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    items += [{"role": role, "content": f"q{k}"} for k in range(1, users + 1)]
    items.append({"type": "function_call_output", "call_id": "c1", "output": "ok"})
    return items


@pytest.mark.parametrize("developer", [False, True], ids=["user", "developer"])
def test_turns_wrapped_in_a_dummy_call_count_for_the_session_limit(
    developer: bool, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(
        tokenizer="approx",
        upstream_metrics_interval=0,
        session_max_turns=3,
        session_limit_action="reject",
    )
    body = {**BODIES[RESPONSES], "input": _wrapped(7, developer)}
    answer = request(proxy.url, "POST", RESPONSES, body, {"x-session-id": "s1"})
    refused_in_envelope(answer, RESPONSES, 409)
    assert answer.json()["error"]["code"] == "session_turn_limit"
    assert engine_got(sim_upstream) == []
