"""One JSON access line per request from a real proxy process, request ids end to end,
and never a word of message content in the logs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from proxy.logs import session_hash
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
GENERATED = re.compile(r"[0-9a-f]{32}")


def access_lines(proxy: ProxyProcess) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in proxy.logs().splitlines() if line.startswith("{")]
    return [line for line in lines if line["logger"] == "trimproxy.access"]


def upstream_request_ids(sim: SimUpstream) -> list[str]:
    return [
        value
        for record in sim.chat_requests()
        for name, value in record["headers"]
        if name.lower() == "x-request-id"
    ]


def test_one_line_per_request_with_ids_and_counts_never_content(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    canary = f"CANARY-{uuid.uuid4().hex}"
    proxy = proxy_server(max_prompt_tokens=60, session_max_turns=2, upstream_metrics_interval=0)
    before = len(access_lines(proxy))  # start-up probes of /healthz log at debug: none
    words = " ".join(f"{canary}-{i}" for i in range(12))

    def chat(messages: list[str], headers: dict[str, str] | None = None) -> httpx.Response:
        roles = ("user", "assistant")
        body = {
            "model": "sim-model",
            "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(messages)],
        }
        return client.post(CHAT, json=body, headers=headers or {})

    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        given = chat([f"{canary} hello"], {"X-Request-ID": "client.id-1_A"})
        generated = chat([f"{canary} hello"])
        rejected_id = chat([f"{canary} hello"], {"X-Request-ID": "no spaces allowed"})
        too_long_id = chat([f"{canary} hello"], {"X-Request-ID": "a" * 129})
        trimmed = chat([words, words, f"{canary} again"], {"X-Session-ID": f"{canary}-session"})
        refused = chat([words * 4])
        assert client.get("/metrics").status_code == 200  # a scrape: debug level, not logged

    assert given.headers["x-request-id"] == "client.id-1_A"
    for response in (generated, rejected_id, too_long_id, trimmed, refused):
        assert GENERATED.fullmatch(response.headers["x-request-id"])
    ids = [
        r.headers["x-request-id"]
        for r in (given, generated, rejected_id, too_long_id, trimmed, refused)
    ]
    assert len(set(ids)) == 6
    # The upstream got the same ids (the refused request never reached it).
    assert upstream_request_ids(sim_upstream) == ids[:5]

    lines = access_lines(proxy)[before:]
    assert [line["request_id"] for line in lines] == ids
    assert all(line["level"] == "info" and line["msg"] == "request" for line in lines)
    assert all(line["method"] == "POST" and line["path"] == CHAT for line in lines)
    assert [line["status"] for line in lines] == [200, 200, 200, 200, 200, 400]
    assert all(line["model"] == "sim-model" for line in lines)
    assert all(line["duration_ms"] > 0 for line in lines)
    assert all(line["upstream_ttfb_ms"] > 0 for line in lines[:5])

    line = lines[4]
    assert line["prompt_tokens_forwarded"] == int(trimmed.headers["x-trimproxy-prompt-tokens"])
    assert line["messages_dropped"] == int(trimmed.headers["x-trimproxy-trimmed-messages"]) > 0
    assert line["prompt_tokens_received"] > line["prompt_tokens_forwarded"]
    session_id = trimmed.headers["x-trimproxy-session-id"]
    assert line["session"] == session_hash(session_id)
    refused_line = lines[5]
    assert refused_line["error"] == "context_length_exceeded"
    assert refused_line["prompt_tokens_received"] > 60
    assert "prompt_tokens_forwarded" not in refused_line
    assert "upstream_ttfb_ms" not in refused_line

    # No message content and no session id in clear, anywhere in the process's output.
    assert canary not in proxy.logs()


def test_every_log_line_is_json(
    proxy_server: Callable[..., ProxyProcess], sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    # FastChat: the start-up and the scraper's 404 notice are logged too.
    proxy = proxy_server(upstream=sim_upstream_factory("fastchat"), upstream_metrics_interval=0.1)
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        assert client.post(CHAT, json=body).status_code == 200
        assert client.get("/nowhere").status_code == 404
    proxy.stop()
    lines = [line for line in proxy.logs().splitlines() if line.strip()]
    parsed = [orjson.loads(line) for line in lines]  # fails on any plain-text line
    loggers = {p["logger"] for p in parsed}
    assert {"trimproxy", "trimproxy.access", "trimproxy.scrape", "uvicorn.error"} <= loggers
    assert "uvicorn.access" not in loggers  # replaced by trimproxy.access
    assert all({"ts", "level", "logger", "msg"} <= set(p) for p in parsed)
    assert [p["status"] for p in parsed if p["logger"] == "trimproxy.access"] == [200, 404]
