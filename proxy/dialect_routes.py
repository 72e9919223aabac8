"""The routes of the dialects beside chat: the Responses API and Anthropic Messages,
read → parse (the dialect) → prepare → forward → relay, as the chat route
(docs/architecture.md §22). Only the parse, the render and the error envelope are the
dialect's own."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.admission import MESSAGES_ANSWER, RESPONSES_ANSWER
from proxy.dependencies import services
from proxy.dialects import anthropic_errors, messages, messages_chat, responses
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.forward import Outgoing, forward
from proxy.logs import request_facts
from proxy.prepare_dialect import Wire, prepare_conversation, wire
from proxy.relay import STREAM_WATCH_DELAY, WATCH_DELAY, Relay, watch_disconnect
from proxy.routes import read_body
from proxy.types import JSON_MEDIA_TYPE

RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = anthropic_errors.MESSAGES_PATH

RESPONSES = wire("responses", responses.to_chat, responses.render, RESPONSES_ANSWER)
MESSAGES = wire(
    "messages", messages.to_chat, messages.render, MESSAGES_ANSWER, messages_chat.chat_tools
)


async def _serve(request: Request, w: Wire, parse: Callable[[bytes], Conversation]) -> Response:
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    conv = parse(raw)
    svc = svc.for_model(conv.model)
    facts = request_facts(request)
    prepared = await prepare_conversation(w, conv, raw, request.headers, svc, facts)
    headers = svc.upstream.transport.request_headers(request.scope["headers"])
    headers["content-type"] = JSON_MEDIA_TYPE
    client_gone = watch_disconnect(
        request.receive, STREAM_WATCH_DELAY if conv.stream else WATCH_DELAY
    )
    # The path in normal form (proxy.paths) and the query as the client sent it (the
    # anthropic SDK names its beta there).
    path = request.scope["raw_path"].decode("ascii")
    query = request.scope.get("query_string", b"")
    if query:
        path = f"{path}?{query.decode('latin-1')}"
    out = Outgoing("POST", path, headers, prepared.body)
    sent = await forward(svc, out, client_gone, facts, prepared)
    return Relay(sent, client_gone)


def _parse_responses(raw: bytes) -> Conversation:
    conv = responses.parse(raw)
    if conv.body.get("background") is True:
        raise InvalidRequest(
            "'background': true is not served through this proxy: a background response "
            "runs unbounded by the prompt budget and session limits. Send it without "
            "'background' (stream it instead).",
            param="background",
        )
    return conv


async def create_response(request: Request) -> Response:
    """``POST /v1/responses``: trimmed to the budget like chat."""
    return await _serve(request, RESPONSES, _parse_responses)


async def create_message(request: Request) -> Response:
    """``POST /v1/messages``: trimmed to the budget like chat; errors in Anthropic's
    envelope, an over-long prompt in the wording agent clients act on."""
    try:
        return await _serve(request, MESSAGES, messages.parse)
    except ProxyError as exc:
        request_facts(request).error = exc.code  # for the access line
        return anthropic_response(exc)


def anthropic_response(exc: ProxyError) -> Response:
    return Response(
        anthropic_errors.error_body(exc),
        status_code=exc.status,
        media_type=JSON_MEDIA_TYPE,
        headers=exc.headers,
    )


def dialect_routes() -> list[Route]:
    """The dialects' routes, ahead of the relayed rest of ``/v1/``."""
    return [
        APIRoute(
            RESPONSES_PATH,
            create_response,
            methods=["POST"],
            summary="Responses API, trimmed to the token budget",
            tags=["openai"],
        ),
        APIRoute(
            MESSAGES_PATH,
            create_message,
            methods=["POST"],
            summary="Anthropic Messages API, trimmed to the token budget",
            tags=["anthropic"],
        ),
    ]
