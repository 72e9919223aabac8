"""The second floor: an aiohttp server with an aiohttp client, the cheapest Python proxy.

No ASGI layer, no parsing, no headers work: the body goes up as bytes, the answer
comes back as bytes, SSE is relayed chunk by chunk. Beside the FastAPI floor
(``floor_fastapi_aiohttp.py``) it shows what the server side (uvicorn + Starlette)
costs on its own. Run by ``bench/overhead.py``:

    python bench/floor_aiohttp.py --port 9003 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import uvloop
from aiohttp import web

_HTTP = web.AppKey("http", aiohttp.ClientSession)


def build(upstream: str) -> web.Application:
    async def client(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        app[_HTTP] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await app[_HTTP].close()

    async def healthz(request: web.Request) -> web.Response:
        return web.Response()

    def relay(path: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        url = upstream + path

        async def relayed(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {"Content-Type": "application/json"}
            http = request.app[_HTTP]
            async with http.post(url, data=body, headers=headers) as up:
                kind = up.headers.get("Content-Type", "application/json")
                if kind.startswith("text/event-stream"):
                    out = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
                    await out.prepare(request)
                    async for chunk in up.content.iter_any():
                        await out.write(chunk)
                    await out.write_eof()
                    return out
                return web.Response(body=await up.read(), status=up.status, content_type=None,
                                    headers={"Content-Type": kind})  # fmt: skip

        return relayed

    app = web.Application()
    app.cleanup_ctx.append(client)
    app.router.add_get("/healthz", healthz)
    # The Responses route too, for bench/responses_peer.py: the same bytes relayed.
    for path in ("/v1/chat/completions", "/v1/responses"):
        app.router.add_post(path, relay(path))
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    # uvloop, as uvicorn picks it: the floors differ in their server, not their loop.
    web.run_app(build(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                access_log=None, print=None, loop=uvloop.new_event_loop())  # fmt: skip
