"""The path rule (docs/architecture.md §3) through a real proxy: one rule for every route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.hardening.raw import request
from tests.proxy.test_paths import BYPASSES, ESCAPES, REFUSED
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"


def long_history(turns: int = 30) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "terse"}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"question {k} " + "lorem " * 30})
        messages.append({"role": "assistant", "content": f"answer {k} " + "ipsum " * 30})
    messages.append({"role": "user", "content": "last"})
    return {"model": "sim-model", "messages": messages, "max_tokens": 4}


@pytest.fixture
def proxy(proxy_server: StartProxy) -> ProxyProcess:
    return proxy_server(tokenizer="approx", max_prompt_tokens=300, upstream_metrics_interval=0)


def test_every_spelling_of_chat_is_trimmed(proxy: ProxyProcess, sim_upstream: SimUpstream) -> None:
    body = long_history()
    for raw in [p for p in BYPASSES if not p.startswith("//")]:
        sim_upstream.clear()
        answer = request(proxy.url, "POST", raw, body)
        assert answer.status == 200, (raw, answer.body)
        assert int(answer.headers["x-trimproxy-trimmed-messages"]) > 0, raw
        (received,) = sim_upstream.chat_requests()
        assert received["raw_path"] == CHAT, raw
        assert len(received["json"]["messages"]) < len(body["messages"]), raw


def test_paths_leaving_v1_are_400_and_never_forwarded(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    for raw in [*ESCAPES, "/v1/models/../../metrics?x=1"]:
        for method in ("GET", "POST"):
            answer = request(proxy.url, method, raw, b"{}" if method == "POST" else None)
            assert answer.status == 400, (raw, answer.status, answer.body)
            assert answer.error_code == "invalid_request", raw
            assert "/v1/" in answer.json()["error"]["message"], raw
    assert sim_upstream.requests() == []


def test_encoded_slashes_and_bad_escapes_are_400(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    # http.client sends only ASCII request lines without spaces.
    for raw in [p for p in REFUSED if p.startswith("/") and " " not in p and p.isascii()]:
        answer = request(proxy.url, "POST", raw, long_history())
        assert answer.status == 400, (raw, answer.status, answer.body)
        assert answer.error_code == "invalid_request", raw
    assert sim_upstream.requests() == []


def test_the_upstream_receives_exactly_the_routed_path_and_query(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    answer = request(proxy.url, "GET", "/v1/x/../models?a=1&b=%2e", None)
    assert answer.status == 200, answer.body
    (received,) = sim_upstream.requests("/v1/models")
    assert received["path"] == "/v1/models"
    assert received["raw_path"] == "/v1/models?a=1&b=%2e"


def test_other_methods_on_chat_are_405(proxy: ProxyProcess, sim_upstream: SimUpstream) -> None:
    for raw in (CHAT, "/v1/./chat/completions"):
        for method in ("GET", "PUT", "PATCH", "DELETE"):
            body = None if method in ("GET", "DELETE") else long_history()
            answer = request(proxy.url, method, raw, body)
            assert answer.status == 405, (raw, method, answer.body)
            assert answer.error_code == "method_not_allowed"
            assert "POST" in answer.json()["error"]["message"]
            assert answer.headers.get("allow") == "POST"
    assert sim_upstream.requests() == []
