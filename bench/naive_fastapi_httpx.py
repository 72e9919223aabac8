"""The naive passthrough the issue measured: FastAPI, ``await request.json()``, and
one shared ``httpx.AsyncClient`` with its default pool. Run by ``bench/overhead.py``:

    python bench/naive_fastapi_httpx.py --port 9002 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse


def build(upstream: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.http = httpx.AsyncClient(timeout=600)
        yield
        await app.state.http.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        payload = await request.json()
        url = f"{upstream}/v1/chat/completions"
        client: httpx.AsyncClient = app.state.http
        if payload.get("stream"):
            upstream_request = client.build_request("POST", url, json=payload)
            resp = await client.send(upstream_request, stream=True)

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in resp.aiter_raw():
                        yield chunk
                finally:
                    await resp.aclose()

            return StreamingResponse(relay(), status_code=resp.status_code,
                                     media_type="text/event-stream")  # fmt: skip
        resp = await client.post(url, json=payload)
        return Response(resp.content, status_code=resp.status_code, media_type="application/json")

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(build(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                access_log=False, log_level="warning")  # fmt: skip
