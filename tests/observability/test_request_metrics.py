"""The app in-process in front of the sim: a known sequence of requests, then the
exact counter increments and histogram counts read from ``GET /metrics``."""

from __future__ import annotations

from typing import Any

import httpx

from tests.observability.promtext import ascrape
from tests.support.inprocess import StartApp
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
WORDS = " ".join(f"w{i}" for i in range(40))


def turns(*contents: str) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]


async def post(
    client: httpx.AsyncClient, messages: list[dict[str, str]], **extra: Any
) -> httpx.Response:
    return await client.post(CHAT, json={"model": "sim-model", "messages": messages, **extra})


async def test_known_sequence_counts_exactly(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(max_prompt_tokens=60, max_body_bytes=2048, upstream_metrics_interval=0)
    client = proxy.client
    plain = [await post(client, turns("hello there")) for _ in range(2)]
    trimmed = await post(client, turns(WORDS, WORDS, "and now?"))
    too_long = await post(client, turns(WORDS * 3))
    too_big = await post(client, turns("x" * 4096))
    sim_upstream.configure(fail_next={"status": 500})
    failed = await post(client, turns("hello there"))
    # Closed before answering twice: the request and its one retry on a fresh connection.
    sim_upstream.configure(fail_next={"close": True, "times": 2})
    dropped = await post(client, turns("hello there"))
    streamed = await post(client, turns("hello there"), stream=True)

    assert [r.status_code for r in plain] == [200, 200]
    assert trimmed.status_code == 200
    assert trimmed.headers["x-trimproxy-trimmed-messages"] == "2"
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert too_big.status_code == 413
    assert failed.status_code == 500  # the upstream's answer, passed through
    assert dropped.status_code == 502
    assert streamed.status_code == 200

    p = int(plain[0].headers["x-trimproxy-prompt-tokens"])
    t = int(trimmed.headers["x-trimproxy-prompt-tokens"])
    m = await ascrape(proxy.client)

    def chat_requests(code: str) -> float:
        return m.value("trimproxy_requests_total", route=CHAT, code=code)

    assert chat_requests("200") == 4
    assert chat_requests("400") == 1
    assert chat_requests("413") == 1
    assert chat_requests("500") == 1
    assert chat_requests("502") == 1
    assert m.value("trimproxy_request_duration_seconds_count", route=CHAT) == 8
    assert m.value("trimproxy_request_duration_seconds_bucket", route=CHAT, le="+Inf") == 8

    # Counted: everything parsed (not the 413); forwarded: everything sent upstream.
    assert m.value("trimproxy_prompt_tokens_count", stage="received") == 7
    assert m.value("trimproxy_prompt_tokens_count", stage="forwarded") == 6
    assert m.value("trimproxy_prompt_tokens_sum", stage="forwarded") == 5 * p + t
    trimmed_tokens = m.value("trimproxy_trimmed_tokens_total")
    assert trimmed_tokens > 0
    received = m.value("trimproxy_prompt_tokens_sum", stage="received")
    # The rest of the received sum is the refused prompt, which is over the budget of 60.
    assert received - (5 * p + t + trimmed_tokens) > 60
    assert m.value("trimproxy_prompt_tokens_bucket", stage="forwarded", le="64.0") == 6

    assert m.value("trimproxy_trimmed_messages_total") == 2
    assert m.value("trimproxy_trim_events_total", reason="budget") == 1
    assert m.value("trimproxy_upstream_errors_total", kind="http_5xx") == 1
    assert m.value("trimproxy_upstream_errors_total", kind="disconnected") == 1
    assert m.value("trimproxy_upstream_retries_total", reason="disconnected") == 1
    assert sum(v for (n, _), v in m.samples.items() if n == "trimproxy_upstream_errors_total") == 2
    # First byte from the upstream: the 200s, the 500 body, the stream.
    assert m.value("trimproxy_upstream_ttfb_seconds_count", route=CHAT) == 5
    # Compared with usage.prompt_tokens: the three non-streamed 200s.
    assert m.value("trimproxy_token_estimate_error_tokens_count") == 3
    # Nothing is in flight: the scrape that reads this is the proxy's own route.
    assert m.value("trimproxy_requests_in_flight") == 0
    assert not any(name.endswith("_created") for name in m.names())


async def test_every_route_is_counted_with_a_bounded_label(
    app_proxy: StartApp,
) -> None:
    proxy = await app_proxy(upstream_metrics_interval=0)
    before = await ascrape(proxy.client)  # the fixture's start-up probes of /healthz are in it
    client = proxy.client
    assert (await client.get("/v1/models")).status_code == 200
    assert (await client.get("/healthz")).status_code == 200
    for i in range(3):
        assert (await client.get(f"/nothing/{i}")).status_code == 404
    m = await ascrape(proxy.client)
    assert m.value("trimproxy_requests_total", route="/v1/models", code="200") == 1
    healthz = ("trimproxy_requests_total", {"route": "/healthz", "code": "200"})
    assert m.value(healthz[0], **healthz[1]) - before.value(healthz[0], **healthz[1]) == 1
    assert m.value("trimproxy_requests_total", route="/metrics", code="200") == 1  # `before`
    assert m.value("trimproxy_requests_total", route="other", code="404") == 3
    routes = {dict(labels)["route"] for name, labels in m.samples if "route" in dict(labels)}
    assert not any(r.startswith("/nothing") for r in routes)
