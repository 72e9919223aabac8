"""The floor trimproxy is held to: a bare FastAPI passthrough with an aiohttp client.

No parsing, no headers work: the body goes up as bytes, the answer comes back as
bytes, SSE is relayed chunk by chunk. Run by ``bench/overhead.py``:

    python bench/floor_fastapi_aiohttp.py --port 9001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse


def build(upstream: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        app.state.http = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await app.state.http.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.body()
        headers = {"Content-Type": "application/json"}
        resp = await app.state.http.post(
            f"{upstream}/v1/chat/completions", data=body, headers=headers
        )
        kind = resp.headers.get("Content-Type", "application/json")
        if kind.startswith("text/event-stream"):

            async def relay() -> AsyncIterator[bytes]:
                async with resp:
                    async for chunk in resp.content.iter_any():
                        yield chunk

            return StreamingResponse(relay(), status_code=resp.status, media_type=kind)
        async with resp:
            return Response(await resp.read(), status_code=resp.status, media_type=kind)

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(build(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                access_log=False, log_level="warning")  # fmt: skip
