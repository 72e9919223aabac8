"""The official openai SDK through the proxy (in-process), and what needs a real
server: chunks relayed as they are generated, and client disconnects."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.inprocess import StartApp, openai_client
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]


def history(turns: int) -> list[Any]:
    messages: list[Any] = [{"role": "system", "content": "You are terse."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"q{k} " + "lorem ipsum " * 40})
        messages.append({"role": "assistant", "content": f"a{k} " + "dolor sit " * 40})
    messages.append({"role": "user", "content": "last question"})
    return messages


async def test_openai_sdk_non_streaming(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    async with openai_client(await app_proxy(tokenizer="approx", max_prompt_tokens=800)) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-model", messages=history(20), max_tokens=8
        )
    completion = raw.parse()
    assert completion.choices[0].message.role == "assistant"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert int(raw.headers["x-trimproxy-trimmed-messages"]) > 0
    assert int(raw.headers["x-trimproxy-prompt-tokens"]) <= 800


async def test_openai_sdk_streaming(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    async with openai_client(await app_proxy(tokenizer="approx", max_prompt_tokens=800)) as client:
        stream = await client.chat.completions.create(
            model="sim-model",
            messages=history(20),
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 8
    (received,) = sim_upstream.chat_requests()
    assert received["json"]["stream"] is True


def test_stream_chunks_arrive_as_generated_not_buffered(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(tokenizer="approx")
    sim_upstream.configure(tokens_per_second=10, completion_tokens=100)
    body = {"model": "sim-model", "messages": history(1), "stream": True, "max_tokens": 100}
    chunks = 0
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                # Ordered, not timed: each chunk is here while the sim is still generating
                # the rest (100 tokens at 10/s); a buffering proxy would send none before
                # the end.
                state = sim_upstream.state()
                assert state["running"] == 1 and state["completed"] == 0, (chunks, state)
            if chunks == 3:
                break


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_closes_the_upstream_at_once(
    proxy_server: StartProxy, sim_upstream: SimUpstream, stream: bool
) -> None:
    proxy = proxy_server(tokenizer="approx")
    sim_upstream.configure(tokens_per_second=4, completion_tokens=200)
    body = (
        '{"model": "sim-model", "max_tokens": 200, "stream": %s, '
        '"messages": [{"role": "user", "content": "write a long story"}]}'
    ) % ("true" if stream else "false")
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.sendall(
        (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
    )
    sim_upstream.wait_for_state(lambda s: s["running"] == 1, timeout=5)
    if stream:
        assert b"data:" in sock.recv(4096)  # the stream is flowing
    sock.close()
    # Waited on, not timed: the sim's record says the request ended by the disconnect,
    # long (50 s) before its answer would have.
    state = sim_upstream.wait_for_state(
        lambda s: s["disconnects"] == 1 and s["running"] == 0, timeout=30.0
    )
    assert state["kv_used_blocks"] == 0
    (record,) = sim_upstream.chat_requests()
    assert record["disconnected"] is True and record["completion_tokens"] < 200
