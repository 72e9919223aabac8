"""A relayed body goes through the whole middleware stack's ``send``: a byte-counting
middleware (what a gzip, tracing or metering one would be) sees every byte of a
streamed answer, chat or passthrough, over real HTTP."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.pipeline.handler import CHAT_PATH
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream


@dataclass
class Counted:
    bytes: int = 0
    chunks: int = 0
    ended: bool = False
    paths: list[str] = field(default_factory=list)


class ByteCounter:
    """Pure ASGI: counts the body bytes and body messages of every answer."""

    def __init__(self, app: ASGIApp, counted: Counted) -> None:
        self.app = app
        self.counted = counted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = self.counted
        counted.paths.append(scope["path"])

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                counted.bytes += len(body)
                counted.chunks += 1 if body else 0
                counted.ended = not message.get("more_body", False)
            await send(message)

        await self.app(scope, receive, counting)


STREAMS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello there"}]},
    "/v1/completions": {"prompt": "hello there"},
}


@pytest.mark.parametrize("path", sorted(STREAMS))
async def test_a_middleware_sees_every_byte_of_a_streamed_answer(
    sim_upstream: SimUpstream, path: str
) -> None:
    # Paced, so that the answer comes in many pieces rather than one.
    sim_upstream.configure(completion_tokens=24, tokens_per_second=400.0)
    counted = Counted()
    app = create_app(make_settings(sim_upstream.url, tokenizer="approx"), Metrics())
    app.add_middleware(ByteCounter, counted=counted)
    body: dict[str, Any] = {"model": "sim-model", "stream": True, "max_tokens": 24, **STREAMS[path]}
    received = bytearray()
    async with (
        served(app) as url,
        httpx.AsyncClient() as client,
        client.stream("POST", url + path, json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for piece in response.aiter_raw():
            received += piece
    assert received.rstrip().endswith(b"data: [DONE]")
    assert received.count(b"data: ") >= 24  # one event per token at least
    assert counted.paths == [path]
    assert counted.bytes == len(received)
    assert counted.chunks > 1 and counted.ended


REQUEST_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("request_var", default="unset")


@dataclass
class Stopped:
    chunks: int = 0
    seen: set[str] = field(default_factory=set)
    cancelled: bool = False


class StopAfter:
    """Sets a context variable around the app, and cancels the request's task once
    ``after`` body chunks have gone out (a timeout or tracing middleware's doing)."""

    def __init__(self, app: ASGIApp, after: int, stopped: Stopped) -> None:
        self.app = app
        self.after = after
        self.stopped = stopped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        stopped = self.stopped

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                stopped.chunks += 1
                stopped.seen.add(REQUEST_VAR.get())
                if stopped.chunks == self.after:
                    task.cancel()
            await send(message)

        REQUEST_VAR.set(scope["path"])
        try:
            await self.app(scope, receive, counting)
        except asyncio.CancelledError:
            stopped.cancelled = True
            task.uncancel()
            raise RuntimeError("stopped by the middleware") from None


async def test_a_stream_stops_with_its_request_and_keeps_the_context(
    sim_upstream: SimUpstream,
) -> None:
    # The relay pumps a stream in a task of its own: a cancellation of the request's
    # task must reach it (no chunk after it), and the chunks go out in the request's
    # context (a tracing middleware's span, a request id).
    sim_upstream.configure(completion_tokens=64, tokens_per_second=100.0)
    stopped = Stopped()
    app = create_app(make_settings(sim_upstream.url, tokenizer="approx"), Metrics())
    app.add_middleware(StopAfter, after=3, stopped=stopped)
    body = {"model": "sim-model", "stream": True, "max_tokens": 64, **STREAMS[CHAT_PATH]}
    async with served(app) as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.HTTPError):
            async with client.stream("POST", url + CHAT_PATH, json=body) as response:
                async for _ in response.aiter_raw():
                    pass
        await asyncio.sleep(0.3)  # 30 tokens' time: a pump left running would send more
    assert stopped.cancelled
    assert stopped.chunks == 3
    assert stopped.seen == {CHAT_PATH}
