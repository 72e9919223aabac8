"""The health prober against a real HTTP server: a probe's answer counts only when
no request found the engine down after the probe was sent. The same rule holds for the
calls that bring back an engine nothing probes (``Upstream.lone``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from proxy.engines.health import Prober
from proxy.upstream import Upstream
from tests.support.inprocess import make_settings


async def test_an_answer_to_a_probe_sent_before_a_failure_is_stale() -> None:
    asked, release = asyncio.Event(), asyncio.Event()

    async def models(request: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    upstream = Upstream(make_settings(f"http://127.0.0.1:{port}"))
    try:
        (engine,) = upstream.engines.all()
        prober = Prober(upstream, timeout=10)
        probe = asyncio.create_task(prober.probe(engine))
        await asyncio.wait_for(asked.wait(), 10)
        # A request finds the engine down while the probe waits for its answer (the
        # engine was SIGKILLed between the probe's connect and a request's).
        upstream.engine_failed(engine, "connect")
        release.set()
        assert await probe is True
        assert engine.health.up is False, "a stale probe put a dead engine back"
        assert engine.health.reason == "connect"
        # A probe sent after the failure does put it back.
        assert await prober.probe(engine) is True
        assert engine.health.up is True
    finally:
        await upstream.aclose()
        await runner.cleanup()


@asynccontextmanager
async def held_chat_server(release: asyncio.Event, asked: asyncio.Event) -> AsyncIterator[str]:
    """A server whose chat answers wait for ``release``; its URL."""

    async def completions(request: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        return web.json_response({"object": "chat.completion", "choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_lone_engine_comes_back_with_an_answer_sent_after_its_failure() -> None:
    asked, release = asyncio.Event(), asyncio.Event()
    async with held_chat_server(release, asked) as url:
        upstream = Upstream(make_settings(url))
        try:
            engine = upstream.lone
            assert engine is not None
            body = b'{"messages": []}'
            headers = {"content-type": "application/json"}

            async def chat() -> int:
                response = await upstream.send(
                    engine, "POST", "/v1/chat/completions", headers, body
                )
                response.release()
                return response.status

            first = asyncio.create_task(chat())
            await asyncio.wait_for(asked.wait(), 10)
            # Another request found it down while this one waited for its answer.
            upstream.engine_failed(engine, "connect")
            release.set()
            assert await first == 200
            assert engine.health.up is False, "an answer sent before the failure put it back"
            assert await chat() == 200
            assert engine.health.up is True
        finally:
            await upstream.aclose()
