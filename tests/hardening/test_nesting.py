"""JSON nested 256-1024 levels deep.

orjson reads 1024 levels but writes fewer than 255, so a proxy that re-serialises
such a body fails. Each body here is valid JSON; the proxy must forward it byte for
byte (checked against what the sim received) or refuse it with a 400 envelope,
never answer 500 — with sessions on (the fingerprint hashes system and first user
messages) and with a budget that trims (the trimmed body is re-serialised).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"


def nested(depth: int) -> str:
    """A JSON value ``depth`` levels deep, as text."""
    return "[" * depth + '"x"' + "]" * depth


def body_with(depth: int, where: str) -> bytes:
    deep = nested(depth)
    history = [
        '{"role": "user", "content": "old ' + "lorem " * 80 + '"}',
        '{"role": "assistant", "content": "old ' + "ipsum " * 80 + '"}',
    ]
    last = '{"role": "user", "content": "hi"}'
    if where == "content":
        last = '{"role": "user", "content": ' + deep + "}"
    elif where == "parts":
        last = '{"role": "user", "content": [{"type": "text", "text": "hi", "x": ' + deep + "}]}"
    elif where == "tool_calls":
        history.append(
            '{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": '
            '"function", "function": {"name": "f", "arguments": "{}"}, "x": ' + deep + "}]}"
        )
        history.append('{"role": "tool", "tool_call_id": "c1", "content": "ok"}')
    elif where == "name":
        last = '{"role": "user", "name": ' + deep + ', "content": "hi"}'
    extra = ', "metadata": ' + deep if where == "field" else ""
    messages = ", ".join([*history, last])
    text = (
        '{"model": "sim-model", "max_tokens": 2, "messages": [{"role": "system", "content": '
        '"s"}, ' + messages + "]" + extra + "}"
    )
    return text.encode()


@pytest.fixture(params=["plain", "sessions", "trimming"])
def proxy(request: pytest.FixtureRequest, proxy_server: StartProxy) -> ProxyProcess:
    settings: dict[str, Any] = {"tokenizer": "approx", "upstream_metrics_interval": 0}
    if request.param == "sessions":
        settings["session_max_turns"] = 50
    if request.param == "trimming":
        settings["max_prompt_tokens"] = 120
    return proxy_server(**settings)


def test_deep_json_is_forwarded_byte_exactly_or_refused(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for depth in (256, 600, 1000):
            for where in ("content", "parts", "tool_calls", "name", "field"):
                sim_upstream.clear()
                check(client, sim_upstream, body_with(depth, where), f"{where}@{depth}")


def check(client: httpx.Client, sim: SimUpstream, body: bytes, case: str) -> None:
    answer = client.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert answer.status_code != 500, (case, answer.text)
    received = sim.chat_requests()  # the sim's listing answers too
    if answer.status_code >= 400:
        assert 400 <= answer.status_code < 500, case
        error = answer.json()["error"]
        assert error["code"] in ("invalid_request", "context_length_exceeded"), case
        assert received == [], case
        return
    (record,) = received
    if answer.headers["x-trimproxy-trimmed-messages"] == "0":
        assert record["body"].encode() == body, case
    else:
        assert record["json"] is None or len(record["json"]["messages"]) < 5, case


def test_the_sims_listing_survives_a_deep_body(sim_upstream: SimUpstream) -> None:
    body = body_with(1000, "content")
    answer = httpx.post(
        sim_upstream.url + CHAT, content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code < 500
    (record,) = sim_upstream.chat_requests()
    assert record["body"].encode() == body and record["json"] is None


@pytest.mark.parametrize("depth", [300, 2000])
def test_too_deep_is_said_as_such_past_orjsons_own_limit(
    proxy_server: StartProxy, sim_upstream: SimUpstream, depth: int
) -> None:
    """Past 1024 levels orjson stops reading with a decode error; the body is still
    valid JSON, and the answer says it is too deep, as it does at 300 levels."""
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0)
    answer = httpx.post(
        proxy.url + CHAT,
        content=body_with(depth, "field"),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert "nested more than 250 levels" in error["message"], error
    assert sim_upstream.chat_requests() == []
