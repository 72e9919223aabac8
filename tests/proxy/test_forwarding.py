"""What the upstream really receives, from the app in-process (tests/support/inprocess.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tests.support.inprocess import StartApp
from tests.support.sim import SimUpstream


def received_headers(record: dict[str, Any]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in record["headers"]}


def conversation(turns: int, words: int = 40) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"question {k} " + "lorem ipsum " * words})
        messages.append({"role": "assistant", "content": f"answer {k} " + "dolor sit " * words})
    messages.append({"role": "user", "content": "and now?"})
    return messages


async def test_untrimmed_body_reaches_upstream_byte_for_byte(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    # Odd spacing, key order and escapes: a re-serialised body would differ.
    raw = (
        b'{ "model" : "sim-model",\n "messages":[{"role":"user","content":"caf\\u00e9  "}],'
        b' "temperature": 0.50, "x_vendor": {"keep": [1, 2.0, null]}, "max_tokens": 8 }'
    )
    r = await proxy.client.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200, r.text
    assert r.headers["x-trimproxy-trimmed-messages"] == "0"
    (received,) = sim_upstream.chat_requests()
    assert received["body"].encode() == raw


async def test_trimmed_request_keeps_system_last_turn_and_unknown_fields(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", max_prompt_tokens=1000)
    messages = conversation(30)
    body = {
        "model": "sim-model",
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0.2,
        "x_vendor": {"nested": [1, 2]},
    }
    r = await proxy.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (received,) = sim_upstream.chat_requests()
    sent = received["json"]
    forwarded = sent["messages"]
    dropped = int(r.headers["x-trimproxy-trimmed-messages"])
    assert dropped > 0 and len(forwarded) == len(messages) - dropped
    assert forwarded[0] == messages[0]
    assert forwarded[-1] == messages[-1]
    assert forwarded[1]["role"] == "user"
    # Kept messages are the originals, in order: a contiguous tail after the system.
    assert forwarded[1:] == messages[len(messages) - len(forwarded) + 1 :]
    assert int(r.headers["x-trimproxy-prompt-tokens"]) <= 1000
    assert {k: v for k, v in sent.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }


async def test_budget_comes_from_the_upstreams_max_model_len(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm", max_model_len=1200)
    proxy = await app_proxy(upstream=sim, tokenizer="approx")
    r = await proxy.client.post(
        "/v1/chat/completions",
        json={"model": "sim-model", "messages": conversation(30), "max_tokens": 200},
    )
    assert r.status_code == 200, r.text
    assert int(r.headers["x-trimproxy-trimmed-messages"]) > 0
    assert int(r.headers["x-trimproxy-prompt-tokens"]) <= 1200 - 200


async def test_fastchat_context_window_from_token_check(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("fastchat", max_model_len=1000)
    proxy = await app_proxy(upstream=sim, tokenizer="approx")
    r = await proxy.client.post(
        "/v1/chat/completions",
        json={"model": "sim-model", "messages": conversation(30), "max_tokens": 100},
    )
    assert r.status_code == 200, r.text
    assert int(r.headers["x-trimproxy-prompt-tokens"]) <= 900
    paths = [req["path"] for req in sim.requests()]
    assert "/api/v1/token_check" in paths


async def test_headers_hop_by_hop_dropped_and_request_id_passed(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    r = await proxy.client.post(
        "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={
            "Authorization": "Bearer client-key",
            "X-Request-ID": "req-123",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "TE": "trailers",
            "X-Custom": "kept",
        },
    )
    assert r.status_code == 200
    (received,) = sim_upstream.chat_requests()
    headers = received_headers(received)
    assert headers["x-request-id"] == "req-123"
    assert headers["x-custom"] == "kept"
    assert "proxy-authorization" not in headers and "te" not in headers
    # An open proxy with no upstream key is transparent to the upstream's own auth.
    assert headers["authorization"] == "Bearer client-key"


async def test_upstream_key_replaces_the_clients(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", api_keys="k1,k2", upstream_api_key="up-secret")
    r = await proxy.client.post(
        "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": "Bearer k2"},
    )
    assert r.status_code == 200, r.text
    (received,) = sim_upstream.chat_requests()
    headers = received_headers(received)
    assert headers["authorization"] == "Bearer up-secret"


async def test_proxy_key_never_travels_upstream(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", api_keys="k1")
    r = await proxy.client.get("/v1/models", headers={"Authorization": "Bearer k1"})
    assert r.status_code == 200
    (received,) = sim_upstream.requests("/v1/models")
    assert "authorization" not in received_headers(received)


async def test_other_routes_pass_through(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    proxy = await app_proxy(tokenizer="approx")
    client = proxy.client
    models = await client.get("/v1/models")
    assert models.status_code == 200
    assert models.json()["data"][0]["id"] == "sim-model"
    completion = await client.post(
        "/v1/completions?trace=1", json={"model": "sim-model", "prompt": "hi", "max_tokens": 4}
    )
    assert completion.status_code == 200
    assert completion.json()["object"] == "text_completion"
    embeddings = await client.post("/v1/embeddings", json={"model": "sim-model", "input": "hi"})
    assert embeddings.status_code == 200
    tokenized = await client.post("/tokenize", json={"model": "sim-model", "prompt": "a b c"})
    assert tokenized.status_code == 200
    assert tokenized.json()["count"] > 0
    paths = [req["path"] for req in sim_upstream.requests()]
    assert paths.count("/v1/completions") == 1
    completions = sim_upstream.requests("/v1/completions")
    assert orjson.loads(completions[0]["body"]) == {
        "model": "sim-model",
        "prompt": "hi",
        "max_tokens": 4,
    }


async def test_health_and_readiness(
    app_proxy: StartApp, sim_upstream_factory: Callable[..., SimUpstream]
) -> None:
    sim = sim_upstream_factory("vllm")
    proxy = await app_proxy(upstream=sim, tokenizer="approx")
    assert (await proxy.client.get("/healthz")).status_code == 200
    assert (await proxy.client.get("/readyz")).status_code == 200
    sim.stop()
    assert (await proxy.client.get("/healthz")).status_code == 200
    not_ready = await proxy.client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["status"] == "not ready"


async def test_a_client_without_encoding_or_agent_gets_identity_and_the_proxys_name(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    """aiohttp would add gzip (an answer the client never asked to decode) and its own
    agent; the proxy names both itself, and forwards a client's own unchanged."""
    proxy = await app_proxy(tokenizer="approx")
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    bare = proxy.client.build_request("POST", "/v1/chat/completions", json=body)
    del bare.headers["accept-encoding"], bare.headers["user-agent"]
    assert (await proxy.client.send(bare)).status_code == 200
    r = await proxy.client.post(
        "/v1/chat/completions",
        json=body,
        headers={"Accept-Encoding": "br", "User-Agent": "my-client/1.0"},
    )
    assert r.status_code == 200
    first, second = (received_headers(r) for r in sim_upstream.chat_requests())
    assert first["accept-encoding"] == "identity"
    assert first["user-agent"].startswith("trimproxy/")
    assert second["accept-encoding"] == "br"
    assert second["user-agent"] == "my-client/1.0"


async def test_a_passthrough_body_without_a_type_goes_up_without_one(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    raw = orjson.dumps({"model": "sim-model", "input": "hi"})
    untyped = proxy.client.build_request("POST", "/v1/embeddings", content=raw)
    assert "content-type" not in untyped.headers
    assert (await proxy.client.send(untyped)).status_code == 200
    typed = await proxy.client.post(
        "/v1/embeddings", content=raw, headers={"Content-Type": "application/json"}
    )
    assert typed.status_code == 200
    first, second = (received_headers(r) for r in sim_upstream.requests("/v1/embeddings"))
    assert "content-type" not in first  # not aiohttp's application/octet-stream
    assert second["content-type"] == "application/json"


async def test_a_cookie_the_upstream_sets_goes_to_that_client_only(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    """One HTTP session serves every client: it must keep no cookie jar of its own.
    (By a host name: aiohttp's jar keeps no cookie of an IP address.)"""
    by_name = sim_upstream.url.replace("127.0.0.1", "localhost")
    proxy = await app_proxy(upstream=by_name, tokenizer="approx")
    sim_upstream.configure(
        fail_next={"status": 200, "body": {"ok": True}, "headers": {"set-cookie": "route=a1"}}
    )
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    first = await proxy.client.post("/v1/chat/completions", json=body)
    assert first.headers["set-cookie"] == "route=a1"  # relayed to the client it was for
    proxy.client.cookies.clear()  # the next request is another client's
    second = await proxy.client.post("/v1/chat/completions", json=body)
    assert second.status_code == 200
    later = received_headers(sim_upstream.chat_requests()[-1])
    assert "cookie" not in later


async def test_the_upstreams_response_headers_come_through_as_sent(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    # The header lines go out as the upstream wrote them (the bytes, names lower-cased),
    # less the hop-by-hop ones and those the proxy's own server sets.
    proxy = await app_proxy(tokenizer="approx")
    sim_upstream.configure(
        fail_next={
            "status": 200,
            "body": {"ok": True},
            "headers": {"X-Upstream-Trace": "a B  c", "Keep-Alive": "timeout=5", "Vary": "x"},
        }
    )
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    answer = await proxy.client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    assert answer.headers["x-upstream-trace"] == "a B  c"
    assert answer.headers["vary"] == "x"
    assert "keep-alive" not in answer.headers
    assert answer.headers["content-length"] == str(len(answer.content))
    assert answer.headers["x-trimproxy-trimmed-messages"] == "0"
