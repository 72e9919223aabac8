"""A small HTTP server on 127.0.0.1 that answers like vLLM's OpenAI server:
``GET /v1/models`` and ``POST /tokenize`` (chat and completion forms), counting with a real HF
tokenizer. Messages are normalised as vLLM does (``proxy.tokens.hf.normalize``, tested on
its own) before the chat template renders them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.tokens.hf.normalize import to_conversation

MAX_MODEL_LEN = 2048


@dataclass
class FakeVLLM:
    tokenizer: Any
    served_name: str = "tiny-chat"
    root: str = "/models/tiny-chat"
    tokenize: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.served_name,
                        "object": "model",
                        "root": self.root,
                        "max_model_len": MAX_MODEL_LEN,
                    }
                ],
            }
        )

    async def tokenize_route(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.calls.append(body)
        if body.get("model") not in (None, self.served_name):
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        if isinstance(body.get("prompt"), str):  # the completion form: encoded as it is
            special = body.get("add_special_tokens", True)
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=special)
            return web.json_response(
                {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}
            )
        conversation, _ = to_conversation(body["messages"], "string")
        try:
            ids = self.tokenizer.apply_chat_template(
                conversation,
                tools=body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:
            return web.json_response({"error": {"message": type(exc).__name__}}, status=400)
        return web.json_response({"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids})

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeVLLM]:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        if self.tokenize:
            app.router.add_post("/tokenize", self.tokenize_route)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            await runner.cleanup()
