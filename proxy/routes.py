"""The app's own routes: the ``/v1/models`` union, ``/healthz``, ``/readyz``,
``/metrics`` and the blind relay of the rest of ``/v1/``. The prompt routes' handlers
are the request path's (``proxy.pipeline.handler``); the chat route is served by
``ChatRoute`` ahead of FastAPI's router, and its ``APIRoute`` here is what ``/docs``
lists (and serves under a root path).
"""

from __future__ import annotations

import asyncio
from enum import Enum

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from proxy.dependencies import Services, services
from proxy.engines.engine import Engine
from proxy.errors import (
    MethodNotAllowed,
    RouteNotFound,
    no_engine_available,
)
from proxy.logs import request_facts
from proxy.metrics import CONTENT_TYPE
from proxy.models import union_models
from proxy.openapi import CHAT_BODY, CHAT_RESPONSES, HealthBody, ReadinessBody
from proxy.paths import PROMPT_PATHS
from proxy.pipeline.forward import Outgoing, forward
from proxy.pipeline.handler import CHAT_PATH, chat_completions
from proxy.pipeline.read import read_body
from proxy.pipeline.relay import STREAM_WATCH_DELAY, WATCH_DELAY, Relay, watch_disconnect
from proxy.types import JSON_MEDIA_TYPE
from proxy.upstream import Readiness, Upstream, unanswered
from proxy.upstream.readiness import ready as upstream_ready


async def passthrough(request: Request) -> Response:
    """Any other upstream route, relayed as it is (bodies streamed back unbuffered)."""
    svc = services(request)
    # The path in normal form (proxy.paths, applied by the Accounting middleware):
    # exactly what was routed goes upstream, and the query string as the client sent it.
    path = request.scope["raw_path"].decode("ascii")
    refuse_unbounded(request.method, path, svc.settings.blind_routes)
    body = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    if svc.upstreams and path == "/v1/models" and request.method == "GET":
        return await union_of_models(request, svc)
    if svc.by_model and body:
        svc = svc.for_model(_model_of(body))  # completions, embeddings: the model's upstream
    query = request.scope.get("query_string", b"")
    if query:
        path = f"{path}?{query.decode('latin-1')}"
    headers = svc.upstream.transport.request_headers(request.scope["headers"])
    # Watched once the body is read (reading it notices a client that leaves before).
    # Not parsed here: a body that names "stream" at all may stream, and only picks the
    # watcher's delay.
    delay = STREAM_WATCH_DELAY if b'"stream"' in body else WATCH_DELAY
    client_gone = watch_disconnect(request.receive, delay)
    out = Outgoing(request.method, path, headers, body or None)
    sent = await forward(svc, out, client_gone, request_facts(request))
    return Relay(sent, client_gone)


def refuse_unbounded(method: str, path: str, blind_routes: str) -> None:
    """What the relay must not pass on: another method on a route that carries a
    prompt (405), another spelling of one (404: an upstream that matched it
    case-blind would run the prompt unbounded), and with TRIMPROXY_BLIND_ROUTES=refuse
    every route but GET /v1/models (404)."""
    if path in PROMPT_PATHS:
        raise MethodNotAllowed(
            f"{method} is not allowed on {path}; it takes POST requests.",
            headers={"allow": "POST"},
        )
    if path.lower() in PROMPT_PATHS:
        raise RouteNotFound(
            f"No route {path}: paths are case-sensitive. Send it to {path.lower()}."
        )
    if blind_routes == "refuse" and not (path == "/v1/models" and method in ("GET", "HEAD")):
        raise RouteNotFound(
            f"{method} {path} is not served: this proxy relays only the routes it keeps "
            "within the token budget (TRIMPROXY_BLIND_ROUTES=refuse). Set "
            "TRIMPROXY_BLIND_ROUTES=relay to relay the rest of /v1/ as it is."
        )


def _model_of(body: bytes) -> str | None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the upstream answers what it makes of it
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) else None


async def union_of_models(request: Request, svc: Services) -> Response:
    """``GET /v1/models`` with several upstreams (``TRIMPROXY_MODELS_FILE``): every
    upstream's list in one (an id listed twice is the first upstream's). An upstream
    that fails is left out; when all fail, the first one's answer is relayed, or, when
    none of the engines could be reached, 503 ``no_engine_available`` as for chat."""

    async def ask(upstream: Upstream, engine: Engine) -> tuple[int, bytes, str]:
        headers = upstream.transport.request_headers(request.scope["headers"])
        response = await upstream.forward("GET", "/v1/models", headers, None, engine=engine)
        try:
            return response.status, await response.read(), response.content_type
        finally:
            response.release()

    asked = [(u, e) for u in svc.upstreams for e in (u.engines.live() or u.engines.all())]
    answers = await asyncio.gather(*(ask(u, e) for u, e in asked), return_exceptions=True)
    good = [a[1] for a in answers if not isinstance(a, BaseException) and a[0] == 200]
    merged = union_models(good)
    if merged is not None:
        return Response(merged, media_type=JSON_MEDIA_TYPE)
    if all(isinstance(a, BaseException) and unanswered(a) for a in answers):
        where = ", ".join(u.base_url for u in svc.upstreams)
        raise no_engine_available(len(asked), where, svc.settings.health_interval)
    first = answers[0]
    if isinstance(first, BaseException):
        raise first
    return Response(first[1], status_code=first[0], media_type=first[2])


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the upstream answers; with ``TRIMPROXY_READY_REQUIRES_UPSTREAM=false``,
    whenever the proxy serves (the upstream's state is still in the body). The upstream
    gets ``TRIMPROXY_READY_TIMEOUT`` seconds, not the read timeout, so a probe's own
    timeout can always outwait this handler."""
    svc = services(request)
    settings = svc.settings
    try:
        async with asyncio.timeout(settings.ready_timeout):
            readiness = await upstream_ready(svc.upstream)
    except TimeoutError:
        readiness = Readiness(
            False,
            f"GET /v1/models did not answer within {settings.ready_timeout:g}s "
            "(TRIMPROXY_READY_TIMEOUT)",
        )
    ready = readiness.ready or not settings.ready_requires_upstream
    detail = readiness.detail
    refused = await store_refuses(svc)
    if refused is not None:
        ready, detail = False, f"{refused}; {detail}"
    return JSONResponse(
        {
            "status": "ready" if ready else "not ready",
            "upstream": settings.upstream_url,
            "upstream_ready": readiness.ready,
            "engines": readiness.engines,
            "engines_up": readiness.engines_up,
            "detail": detail,
        },
        status_code=200 if ready else 503,
    )


async def store_refuses(svc: Services) -> str | None:
    """Why every request would be refused now, when the session store or the KV
    admission ledger is down and ``TRIMPROXY_SESSION_STORE_FAILURE=closed`` refuses what
    it cannot check; None otherwise (``open`` serves without them, and stays ready)."""
    if svc.settings.session_store_failure != "closed":
        return None
    sessions = svc.sessions
    if sessions is not None and not await sessions.store.ping():
        return (
            f"the session store ({sessions.store.name}, TRIMPROXY_REDIS_URL) does not "
            "answer, and TRIMPROXY_SESSION_STORE_FAILURE=closed refuses every request it "
            "cannot check"
        )
    # Every engine's ledger is in the one Redis: asking one asks them all. A ledger
    # without a capacity yet admits unmetered, never asking the store.
    metered = [g.ledger for g in svc.gates.values() if g.ledger.capacity is not None]
    if metered and not await metered[0].ping():
        return (
            f"the KV admission ledger ({metered[0].name}, TRIMPROXY_REDIS_URL) does not "
            "answer, and TRIMPROXY_SESSION_STORE_FAILURE=closed refuses every request it "
            "cannot admit"
        )
    return None


async def metrics(request: Request) -> Response:
    return Response(services(request).metrics.render(), media_type=CONTENT_TYPE)


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


def routes() -> list[Route]:
    """The proxy's routes. FastAPI's ``APIRoute`` where ``/docs`` should list them; the
    relayed rest as plain Starlette routes, which no schema lists (the upstream's API
    describes them) and which skip FastAPI's per-request dependency solving."""
    tags: list[str | Enum] = ["proxy"]
    documented: list[Route] = [
        APIRoute(
            CHAT_PATH,
            chat_completions,
            methods=["POST"],
            summary="Chat completion, trimmed to the token budget",
            responses=CHAT_RESPONSES,
            openapi_extra=CHAT_BODY,
            tags=["openai"],
        ),
        APIRoute(
            "/v1/models",
            passthrough,
            methods=["GET"],
            summary="The upstream's models (their union with a models file)",
            response_class=JSONResponse,
            tags=["openai"],
        ),
        APIRoute("/healthz", healthz, methods=["GET"], response_model=HealthBody, tags=tags),
        APIRoute(
            "/readyz",
            readyz,
            methods=["GET"],
            response_model=ReadinessBody,
            responses={503: {"model": ReadinessBody, "description": "The upstream is not ready"}},
            tags=tags,
        ),
        APIRoute(
            "/metrics",
            metrics,
            methods=["GET"],
            summary="Prometheus metrics",
            response_class=PlainTextResponse,
            tags=tags,
        ),
    ]
    return [
        *documented,
        Route("/v1/{rest:path}", passthrough, methods=_METHODS),
        Route("/tokenize", passthrough, methods=["POST"]),
        Route("/detokenize", passthrough, methods=["POST"]),
        # HEAD as before (Starlette adds it to every GET route, FastAPI does not),
        # kept out of the schema.
        *(
            Route(path, handler, methods=["HEAD"], include_in_schema=False)
            for path, handler in (("/healthz", healthz), ("/readyz", readyz), ("/metrics", metrics))
        ),
    ]
