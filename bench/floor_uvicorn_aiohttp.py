"""The third floor: uvicorn serving a bare ASGI callable, with an aiohttp client.

trimproxy's own server stack with nothing of a framework on it: no FastAPI, no
Starlette request or response objects, no middleware. The body goes up as bytes, the
answer comes back as bytes, SSE is relayed chunk by chunk. Beside ``floor_aiohttp.py``
it shows what uvicorn costs against aiohttp's server; beside the FastAPI floor, what
the framework costs (docs/performance.md §5b). Run by ``bench/overhead.py``:

    python bench/floor_uvicorn_aiohttp.py --port 9004 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

Message = dict[str, Any]


def build(upstream: str) -> Any:
    clients: list[aiohttp.ClientSession] = []

    async def lifespan(receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
                clients.append(aiohttp.ClientSession(connector=connector, auto_decompress=False))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await clients[0].close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["method"] != "POST":  # /healthz
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {"Content-Type": "application/json"}
        url = upstream + scope["path"]
        async with clients[0].post(url, data=b"".join(parts), headers=headers) as up:
            kind = up.headers.get("Content-Type", "application/json")
            if kind.startswith("text/event-stream"):
                start = [(b"content-type", kind.encode())]
                await send({"type": "http.response.start", "status": up.status, "headers": start})
                async for chunk in up.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            body = await up.read()
        start = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": up.status, "headers": start})
        await send({"type": "http.response.body", "body": body})

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(build(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                access_log=False, log_level="warning", lifespan="on")  # fmt: skip
