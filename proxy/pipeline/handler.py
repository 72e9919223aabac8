"""The one handler of every prompt route (docs/architecture.md §1, §22): read → parse
(the dialect) → prepare → forward → relay, for chat, the Responses API, Anthropic
Messages and completions alike, and any row the dialect table gains. Only what the
``Dialect`` record holds is a dialect's own.

The handlers take the raw request and return responses directly: FastAPI's body
validation would parse every message into models, which the proxy never needs. Every
error a prompt route answers is in its dialect's envelope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.dependencies import Services, services
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.logs import request_facts
from proxy.pipeline import chain as response_chain
from proxy.pipeline import compaction, truncation
from proxy.pipeline.dialect import Dialect, Envelope
from proxy.pipeline.forward import Outgoing, forward
from proxy.pipeline.prepare import note_model, prepare
from proxy.pipeline.read import read_body
from proxy.pipeline.relay import STREAM_WATCH_DELAY, WATCH_DELAY, Relay, watch_disconnect
from proxy.types import JSON_MEDIA_TYPE

# A non-streaming answer up to this size is kept to compare usage with the count.
USAGE_CAPTURE_BYTES = 1 << 20

Handler = Callable[[Request], Awaitable[Response]]


def handler_for(dialect: Dialect) -> Handler:
    """The handler of ``dialect``'s prompt route: its errors in its own envelope."""

    async def handle(request: Request) -> Response:
        try:
            return await serve(dialect, request)
        except ProxyError as exc:
            return error_response(request, exc, dialect.envelope)

    return handle


async def serve(dialect: Dialect, request: Request) -> Response:
    """read → parse → prepare → forward → relay (docs/architecture.md §1)."""
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    conv = dialect.parse(raw)
    svc = svc.for_model(conv.model)  # TRIMPROXY_MODELS_FILE: the model's own upstream
    facts = request_facts(request)  # for the access line
    # Responses: the chain trimproxy stores, expanded before trimming (§22).
    linked = await response_chain.link(svc, conv, request.headers) if dialect.stored else None
    chain = None
    if linked is not None:
        conv, raw, chain = linked.conv, linked.raw, linked.session
    # Responses: compaction items expanded, or compaction answered (§24).
    step = await compaction.step(request, svc, dialect, conv, raw) if dialect.stored else None
    if step is not None:
        if step.answer is not None:
            return step.answer
        conv, raw = step.conv, step.raw
    # Messages: its context edits applied first (the row's ``edit``).
    edit = None if dialect.edit is None else await dialect.edit(svc, dialect, conv, facts)
    client = None
    if edit is not None:
        client, conv, raw = conv, edit.conv, edit.raw
    prepared = await prepare(
        dialect, conv, raw, request.headers, svc, facts, chain=chain, client=client
    )
    if dialect.stored:
        truncation.check(conv, prepared)  # Responses: 'truncation': 'disabled' (§24)
    headers = svc.upstream.request_headers(request.scope["headers"])
    headers["content-type"] = JSON_MEDIA_TYPE
    # Watched from here on: a client may leave KV admission's line, and one that stops
    # a stream is the common case (so a stream's watcher starts at once).
    client_gone = watch_disconnect(
        request.receive, STREAM_WATCH_DELAY if conv.stream else WATCH_DELAY
    )
    # The query as the client sent it (the anthropic SDK names its beta there).
    path = dialect.upstream or dialect.path
    query = request.scope.get("query_string", b"")
    if query:
        path = f"{path}?{query.decode('latin-1')}"
    out = Outgoing("POST", path, headers, prepared.body)
    sent = await forward(svc, out, client_gone, facts, prepared)
    # A JSON answer is kept (up to a bound) to compare its usage with the count.
    capture = 0 if conv.stream else USAGE_CAPTURE_BYTES
    relay: Response = Relay(
        sent, client_gone, capture_limit=capture, error_event=dialect.stream_error
    )
    if edit is not None:
        relay = edit.wrap(relay)
    if step is not None:
        relay = step.wrap(relay)
    if linked is None:
        return relay
    return response_chain.keeping(svc, request.headers, linked, relay, sent, prepared, facts)


def error_response(request: Request, exc: ProxyError, envelope: Envelope) -> Response:
    """``exc`` in ``envelope``; the access line is told its code."""
    request_facts(request).error = exc.code
    return Response(
        envelope.body(exc), status_code=exc.status, media_type=JSON_MEDIA_TYPE, headers=exc.headers
    )


class DirectRoute:
    """``POST`` on each dialect's prompt route straight to its handler, ahead of the router.

    Pure ASGI, innermost of the proxy's middleware: every request still passes the
    accounting, the API keys and the in-flight limit, but the routes that carry the
    traffic skip the layers between there and the handler (Starlette's exception
    middleware, its router's matching, two exception wrappers around the handler and
    around every ``send``; docs/architecture.md §1, docs/performance.md §6). It answers
    a ``ProxyError`` in the dialect's envelope, as the route's handler does; anything
    else propagates to the same server-error handler as before.
    """

    def __init__(self, app: ASGIApp, dialects: Sequence[Dialect]) -> None:
        self.app = app
        self.dialects = {dialect.path: dialect for dialect in dialects}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Anything else (another method on a prompt path too: the router answers its
        # 405, with an Allow header) goes the usual way.
        dialect = self.dialects.get(scope["path"]) if scope["type"] == "http" else None
        if dialect is None or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        # ``serve`` itself, not ``handler_for``'s wrapper: a frame less a request.
        try:
            response = await serve(dialect, request)
        except ProxyError as exc:
            response = error_response(request, exc, dialect.envelope)
        await response(scope, receive, send)


def prompt_routes(dialects: tuple[Dialect, ...]) -> list[BaseRoute]:
    """Every dialect's prompt route and the routes beside it, ahead of the relayed rest
    of ``/v1/``."""
    found: list[BaseRoute] = []
    for dialect in dialects:
        found.append(
            APIRoute(
                dialect.path,
                handler_for(dialect),
                methods=["POST"],
                summary=dialect.summary,
                tags=[dialect.tag],
                responses=dialect.openapi_responses,
                openapi_extra=dialect.openapi_body,
            )
        )
        if dialect.more_routes is not None:
            found.extend(dialect.more_routes(dialect))
    return found


#: A request's prompt tokens as its prompt route trims by, and before the dialect's edits.
CountTokens = Callable[[Services, Dialect, Conversation], Awaitable[tuple[int, int]]]


def count_tokens_route(
    path: str, parse: Callable[[bytes], Conversation], counted: CountTokens
) -> Callable[[Dialect], list[BaseRoute]]:
    """A route on ``path`` that answers the prompt tokens of a request in the dialect
    (read by ``parse``, counted by ``counted``) as its prompt route trims by
    (Anthropic's ``count_tokens``)."""

    def routes(dialect: Dialect) -> list[BaseRoute]:
        async def count(request: Request) -> Response:
            try:
                return await count_message_tokens(dialect, parse, counted, request)
            except ProxyError as exc:
                return error_response(request, exc, dialect.envelope)

        return [
            APIRoute(
                path,
                count,
                methods=["POST"],
                summary="Anthropic Messages token count, answered by the proxy",
                tags=[dialect.tag],
            )
        ]

    return routes


async def count_message_tokens(
    dialect: Dialect,
    parse: Callable[[bytes], Conversation],
    counted: CountTokens,
    request: Request,
) -> Response:
    """``POST /v1/messages/count_tokens``, answered here: the count the Messages route
    trims by, which is the engine's (``prepare.input_tokens``)."""
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    conv = parse(raw)
    if not conv.model:
        raise InvalidRequest("'model' is required.", param="model")
    svc = svc.for_model(conv.model)
    facts = request_facts(request)
    note_model(svc.settings.max_model_name_length, conv.model, facts, dialect.endpoint)
    tokens, original = await counted(svc, dialect, conv)
    # vLLM's answer, context_management included: the count before the edits.
    body = {"input_tokens": tokens, "context_management": {"original_input_tokens": original}}
    return Response(orjson.dumps(body), media_type=JSON_MEDIA_TYPE)
