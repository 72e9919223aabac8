"""The ``endpoint`` label, from a real proxy process in front of the simulated engine: a
chat, a Responses and a Messages conversation past the budget and the session's turn
limit each show up under their own endpoint on the prompt, trim, session and admission
series, and each access line names its endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from proxy.metrics import ENDPOINTS
from tests.observability.promtext import scrape
from tests.support.processes import ProxyProcess

WORDS = " ".join(f"w{i}" for i in range(40))
# Three user turns: over the budget of 60 tokens, and past the session limit of 2 turns.
TURNS = [WORDS, "an answer", WORDS, "another answer", "and now?"]
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def roles(texts: list[str]) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)]


def body(endpoint: str) -> dict[str, Any]:
    if endpoint == "chat":
        return {"model": "sim-model", "messages": roles(TURNS)}
    if endpoint == "responses":
        return {"model": "sim-model", "input": roles(TURNS), "store": False}
    return {"model": "sim-model", "messages": roles(TURNS), "max_tokens": 16}


def send_each(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for endpoint, path in ROUTES.items():
            headers = {"x-session-id": f"conversation-{endpoint}"}
            reply = client.post(path, json=body(endpoint), headers=headers)
            assert reply.status_code == 200, (endpoint, reply.text)
            assert int(reply.headers["x-trimproxy-trimmed-messages"]) > 0, endpoint


def start(proxy_server: Callable[..., ProxyProcess]) -> ProxyProcess:
    return proxy_server(
        max_prompt_tokens=60,
        session_max_turns=2,
        kv_admission="1000000",  # on, far above the traffic: its counters are exported
        upstream_metrics_interval=0,
    )


def test_each_endpoint_has_its_own_series(proxy_server: Callable[..., ProxyProcess]) -> None:
    proxy = start(proxy_server)
    send_each(proxy.url)
    m = scrape(proxy.url)
    for endpoint in ROUTES:
        for stage in ("received", "forwarded"):
            count = "trimproxy_prompt_tokens_count"
            assert m.value(count, stage=stage, endpoint=endpoint, model="sim-model") == 1
        assert m.value("trimproxy_trim_events_total", endpoint=endpoint) == 1
        assert m.value("trimproxy_trimmed_messages_total", endpoint=endpoint) > 0
        assert m.value("trimproxy_trimmed_tokens_total", endpoint=endpoint) > 0
        limit = {"reason": "turns", "action": "reset", "endpoint": endpoint}
        assert m.value("trimproxy_session_limit_total", **limit) == 1
    # Every endpoint's refusal counters read 0 from the start (completions included).
    for endpoint in ENDPOINTS:
        for reason in ("timeout", "store_unavailable", "client_closed"):
            rejected = {"reason": reason, "endpoint": endpoint}
            assert m.has("trimproxy_admission_rejected_total", **rejected), rejected
    # Every JSON answer's usage is set beside the count (the sim counts as the proxy).
    errors = "trimproxy_token_estimate_error_tokens"
    assert m.value(f"{errors}_count", model="sim-model") == len(ROUTES)
    assert m.value(f"{errors}_sum", model="sim-model") == 0
    # Series by route as well: the dialects' own routes, not "other" or chat's.
    for path in ROUTES.values():
        assert m.value("trimproxy_requests_total", route=path, code="200") == 1
        assert m.value("trimproxy_upstream_ttfb_seconds_count", route=path) == 1


def access_by_path(proxy: ProxyProcess, last: str) -> dict[str, dict[str, Any]]:
    """The access lines by path, once ``last``'s is written: the line goes out after
    the answer's last byte, so the client can read the answer before it is logged."""
    deadline = time.monotonic() + 10.0
    while True:
        lines = [orjson.loads(ln) for ln in proxy.logs().splitlines() if ln.startswith("{")]
        access = {ln["path"]: ln for ln in lines if ln["logger"] == "trimproxy.access"}
        if last in access or time.monotonic() > deadline:
            return access
        time.sleep(0.05)


def test_the_access_line_names_the_endpoint(proxy_server: Callable[..., ProxyProcess]) -> None:
    proxy = start(proxy_server)
    send_each(proxy.url)
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        assert client.get("/v1/models").status_code == 200  # relayed: no endpoint
    access = access_by_path(proxy, "/v1/models")
    for endpoint, path in ROUTES.items():
        assert access[path]["endpoint"] == endpoint, access[path]
        assert access[path]["messages_dropped"] > 0
    assert "endpoint" not in access["/v1/models"]
