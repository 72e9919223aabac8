"""The health prober against a real HTTP server: a probe's answer counts only when
no request found the engine down after the probe was sent. The same rule holds for the
calls that bring back an engine nothing probes (``Upstream.lone``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from proxy.upstream import Upstream
from proxy.upstream.probe import Prober
from tests.support.inprocess import make_settings


class HeldServer:
    """An engine whose answers wait for ``release``; ``asked`` is set once a request
    is in, so a test can fail the engine while that request waits for its answer."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    def answer(self, body: dict[str, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            self.asked.set()
            await self.release.wait()
            return web.json_response(body)

        return handler

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Upstream]:
        """The server on 127.0.0.1, and an upstream of its one URL."""
        app = web.Application()
        app.router.add_get("/v1/models", self.answer({"object": "list", "data": []}))
        app.router.add_post("/v1/chat/completions", self.answer({"object": "chat.completion"}))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        upstream = Upstream(make_settings(f"http://127.0.0.1:{runner.addresses[0][1]}"))
        try:
            yield upstream
        finally:
            await upstream.aclose()
            await runner.cleanup()


async def test_an_answer_to_a_probe_sent_before_a_failure_is_stale() -> None:
    server = HeldServer()
    async with server.serving() as upstream:
        (engine,) = upstream.engines.all()
        prober = Prober(upstream, timeout=10)
        probe = asyncio.create_task(prober.probe(engine))
        await asyncio.wait_for(server.asked.wait(), 10)
        # A request finds the engine down while the probe waits for its answer (the
        # engine was SIGKILLed between the probe's connect and a request's).
        upstream.transport.engine_failed(engine, "connect")
        server.release.set()
        assert await probe is True
        assert engine.health.up is False, "a stale probe put a dead engine back"
        assert engine.health.reason == "connect"
        # A probe sent after the failure does put it back.
        assert await prober.probe(engine) is True
        assert engine.health.up is True


async def test_a_lone_engine_comes_back_with_an_answer_sent_after_its_failure() -> None:
    server = HeldServer()
    async with server.serving() as upstream:
        engine = upstream.lone
        assert engine is not None
        headers = {"content-type": "application/json"}

        async def chat() -> int:
            path = "/v1/chat/completions"
            response = await upstream.transport.send(engine, "POST", path, headers, b"{}")
            response.release()
            return response.status

        first = asyncio.create_task(chat())
        await asyncio.wait_for(server.asked.wait(), 10)
        # Another request found it down while this one waited for its answer.
        upstream.transport.engine_failed(engine, "connect")
        server.release.set()
        assert await first == 200
        assert engine.health.up is False, "an answer sent before the failure put it back"
        assert await chat() == 200
        assert engine.health.up is True
