"""Assembly of the simulated upstream: middleware, ``build_app``, ``serve``, ``run``.

Routes, both dialects unless marked (``routes.py``):

* ``GET /v1/models``; ``POST /v1/chat/completions`` (stream or not);
  ``POST /v1/completions``; ``POST /v1/embeddings``
* vLLM: ``GET /health``, ``GET /metrics``, ``POST /tokenize``; the Responses API
  (``POST /v1/responses``, ``GET /v1/responses/{id}``: ``responses.py``) and the
  Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``:
  ``messages.py``)
* FastChat: ``POST /api/v1/token_check``, ``POST /api/v1/chat/completions``; the
  Responses and Messages routes are FastAPI's 404
* the sim's own, not recorded: ``/_sim/*`` (``control.py``)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from proxy.sim import control, messages, responses, routes
from proxy.sim.clock import Clock
from proxy.sim.config import SimConfig
from proxy.sim.dialect import SimError
from proxy.sim.state import RECORD, STATE, FailRule, SimState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _record_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Record every request but the sim's own, apply injected failures, and turn a
    ``SimError`` into the dialect's error answer."""
    path = request.path
    if path.startswith("/_sim/"):
        return await handler(request)
    state = request.app[STATE]
    state.requests_total += 1
    record = state.recorder.add(
        request.method,
        path,
        request.query_string,
        list(request.headers.items()),
        await request.read(),
        raw_path=request.raw_path,
    )
    request[RECORD] = record
    try:
        key = state.config.api_key
        if key is not None and not _authorized(request, key):
            response: web.StreamResponse = _unauthorized()
        elif (rule := state.take_failure(path) if state.fail_rules else None) is not None:
            response = await _fail(request, rule)
        else:
            try:
                response = await handler(request)
            except SimError as exc:
                response = routes.error_response(exc)
        record.status = response.status
        return response
    except web.HTTPException as exc:
        record.status = exc.status
        raise
    finally:
        record.ended_at = time.time()


def _authorized(request: web.Request, key: str) -> bool:
    if request.path == "/health":
        return True
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), key)


def _unauthorized() -> web.Response:
    # vLLM's answer to a missing or wrong key (its AuthenticationMiddleware).
    return web.Response(
        body=orjson.dumps({"error": "Unauthorized"}), status=401, content_type="application/json"
    )


async def _fail(request: web.Request, rule: FailRule) -> web.StreamResponse:
    if rule.delay_seconds:
        await asyncio.sleep(rule.delay_seconds)
    if rule.close:
        # An upstream that died mid-request: the connection ends with no answer.
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499)
    body = rule.body
    if isinstance(body, str):
        response = web.Response(text=body, status=rule.status)
    else:
        default = {"error": {"message": "injected failure", "type": "sim", "code": rule.status}}
        payload = orjson.dumps(default if body is None else body)
        response = web.Response(body=payload, status=rule.status, content_type="application/json")
    response.headers.update(rule.headers)
    return response


def build_app(config: SimConfig, clock: Clock | None = None) -> web.Application:
    """The sim as an aiohttp application (``serve`` runs it; so can a test server).
    ``clock`` replaces the wall clock (tests: ``clock.StepClock``)."""
    app = web.Application(middlewares=[_record_middleware], client_max_size=config.max_body_bytes)
    app[STATE] = SimState(config, clock)
    router = app.router
    router.add_get("/v1/models", routes.models)
    router.add_post("/v1/chat/completions", routes.chat_completions)
    router.add_post("/v1/completions", routes.completions)
    router.add_post("/v1/embeddings", routes.embeddings)
    if config.dialect == "vllm":
        router.add_get("/health", routes.health)
        router.add_get("/metrics", routes.metrics)
        router.add_post("/tokenize", routes.tokenize)
        router.add_post("/reset_prefix_cache", routes.reset_prefix_cache)
        router.add_post("/v1/responses", responses.responses)
        router.add_get("/v1/responses/{response_id}", responses.retrieve)
        router.add_delete("/v1/responses/{response_id}", responses.no_delete)
        router.add_post("/v1/responses/{response_id}/cancel", responses.retrieve)
        router.add_post("/v1/messages", messages.messages)
        router.add_post("/v1/messages/count_tokens", messages.count_tokens)
    else:
        router.add_post("/api/v1/token_check", routes.token_check)
        router.add_post("/api/v1/chat/completions", routes.chat_completions)
        for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
            router.add_post(path, routes.not_found)
    control.add_routes(router)
    return app


async def serve(
    config: SimConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready: Callable[[str], None] | None = None,
    engines: int = 1,
) -> None:
    """Serve until cancelled. ``ready`` gets the base URL once the socket listens;
    with ``port=0`` it carries the port the OS chose.

    ``engines`` > 1 serves that many independent engines (each its own prefix cache,
    KV pool, queue and metrics, like separate vLLM servers) on ports ``port``,
    ``port + 1``, ... (or each a free one with ``port=0``); ``ready`` gets each URL,
    in order."""
    if engines < 1:
        raise ValueError("engines must be at least 1")
    runners: list[web.AppRunner] = []
    try:
        for index in range(engines):
            runner = web.AppRunner(
                build_app(config),
                access_log=None,  # a log line per request would cost more than the answer
                handler_cancellation=True,  # a client that leaves cancels its handler at once
            )
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, port + index if port else 0, backlog=1024)
            await site.start()
            if ready is not None:
                ready(_bound_url(runner, host))
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def _bound_url(runner: web.AppRunner, host: str) -> str:
    address = runner.addresses[0]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{address[1]}"


def run(
    config: SimConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready: Callable[[str], None] | None = None,
    engines: int = 1,
) -> None:
    """``serve`` for the command line: blocks; Ctrl-C stops it quietly."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, host, port, ready=ready, engines=engines))
