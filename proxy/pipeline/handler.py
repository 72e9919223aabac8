"""The handlers of the prompt routes: chat (``ChatRoute``, ahead of the router), the
Responses API, Anthropic Messages (and its token count) and completions, each read →
parse (the dialect) → prepare → forward → relay (docs/architecture.md §1, §22). Only
the parse, the render and the error envelope are the dialect's own; a raw prompt has
its own prepare step.

The handlers take the raw request and return responses directly: FastAPI's body
validation would parse every message into models, which the proxy never needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.admission import MESSAGES_ANSWER, RESPONSES_ANSWER
from proxy.chat import parse_chat
from proxy.dependencies import Services, services
from proxy.dialects import anthropic_errors, completions, messages, messages_chat, responses
from proxy.dialects.anthropic_errors import speaks_anthropic
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.logs import RequestFacts, request_facts
from proxy.pipeline import chain as response_chain
from proxy.pipeline import compaction, context_management, truncation
from proxy.pipeline.breakoff import sse_error_event
from proxy.pipeline.forward import Outgoing, forward
from proxy.pipeline.prepare import Prepared, note_model
from proxy.pipeline.prepare import prepare as prepare_chat
from proxy.pipeline.prepare_completion import prepare_completion
from proxy.pipeline.prepare_dialect import Wire, prepare_conversation, wire
from proxy.pipeline.read import read_body
from proxy.pipeline.relay import STREAM_WATCH_DELAY, WATCH_DELAY, Relay, watch_disconnect
from proxy.pipeline.responses_routes import responses_routes
from proxy.sessions.identity import Identity
from proxy.types import JSON_MEDIA_TYPE

CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = anthropic_errors.MESSAGES_PATH
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
COMPLETIONS_PATH = "/v1/completions"
# A non-streaming answer up to this size is kept to compare usage with the count.
USAGE_CAPTURE_BYTES = 1 << 20

RESPONSES = wire("responses", responses.to_chat, responses.render, RESPONSES_ANSWER)
MESSAGES = wire(
    "messages", messages.to_chat, messages.render, MESSAGES_ANSWER, messages_chat.chat_tools
)


async def chat_completions(request: Request) -> Response:
    """read → parse → prepare → forward → relay (docs/architecture.md §1)."""
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    chat = parse_chat(raw)
    svc = svc.for_model(chat.model)  # TRIMPROXY_MODELS_FILE: the model's own upstream
    facts = request_facts(request)  # for the access line
    prepared = await prepare_chat(chat, raw, request.headers, svc, facts)
    headers = svc.upstream.transport.request_headers(request.scope["headers"])
    headers["content-type"] = JSON_MEDIA_TYPE
    # Watched from here on: a client may leave KV admission's line, and one that stops
    # a stream is the common case (so a stream's watcher starts at once).
    client_gone = watch_disconnect(
        request.receive, STREAM_WATCH_DELAY if chat.stream else WATCH_DELAY
    )
    out = Outgoing("POST", CHAT_PATH, headers, prepared.body)
    sent = await forward(svc, out, client_gone, facts, prepared)
    return Relay(sent, client_gone, capture_limit=0 if chat.stream else USAGE_CAPTURE_BYTES)


def error_response(request: Request, exc: ProxyError) -> Response:
    """``exc`` in the envelope of the path's API (OpenAI's; Anthropic's on the Messages
    paths); the access line is told its code."""
    request_facts(request).error = exc.code
    path = request.scope["path"]
    body = anthropic_errors.error_body(exc) if speaks_anthropic(path) else exc.body()
    return Response(body, status_code=exc.status, media_type=JSON_MEDIA_TYPE, headers=exc.headers)


class ChatRoute:
    """``POST /v1/chat/completions`` straight to its handler, ahead of the router.

    Pure ASGI, innermost of the proxy's middleware: every request still passes the
    accounting, the API keys and the in-flight limit, but the one route that carries
    the traffic skips the layers between there and the handler (Starlette's
    exception middleware, its router's matching, two exception wrappers around the
    handler and around every ``send``; docs/architecture.md §1, docs/performance.md §6). It
    answers a ``ProxyError`` as the app's handler does; anything else propagates to
    the same server-error handler as before.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Anything else (another method on this path too: the router answers its 405,
        # with an Allow header) goes the usual way.
        if (
            scope["type"] != "http"
            or scope["path"] != CHAT_PATH
            or scope["method"] != "POST"
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await chat_completions(request)
        except ProxyError as exc:
            response = error_response(request, exc)
        await response(scope, receive, send)


Prepare = Callable[
    [Conversation, bytes, Mapping[str, str], Services, RequestFacts], Awaitable[Prepared]
]


def _trimmed(w: Wire, chain: Identity | None = None) -> Prepare:
    """The prepare step of a dialect whose items are trimmed (``prepare_conversation``);
    ``chain``: the session of the stored chain a Responses request continues."""

    async def prepare(
        conv: Conversation, raw: bytes, headers: Mapping[str, str], svc: Services,
        facts: RequestFacts,
    ) -> Prepared:  # fmt: skip
        return await prepare_conversation(w, conv, raw, headers, svc, facts, chain=chain)

    return prepare


async def _serve(
    request: Request,
    prepare: Prepare,
    parse: Callable[[bytes], Conversation],
    error_event: Callable[[ProxyError], bytes] = sse_error_event,
    chained: bool = False,
) -> Response:
    svc = services(request)
    raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
    conv = parse(raw)
    svc = svc.for_model(conv.model)
    facts = request_facts(request)
    # Responses: the chain trimproxy stores, expanded before trimming (§22).
    linked = await response_chain.link(svc, conv, request.headers) if chained else None
    if linked is not None:
        conv, raw = linked.conv, linked.raw
        prepare = _trimmed(RESPONSES, linked.session)
    # Responses: compaction items expanded, or compaction answered (§24).
    step = await compaction.step(request, svc, conv, raw) if chained else None
    if step is not None:
        if step.answer is not None:
            return step.answer
        conv, raw = step.conv, step.raw
    prepared = await prepare(conv, raw, request.headers, svc, facts)
    if chained:
        truncation.check(conv, prepared)  # Responses: 'truncation': 'disabled' (§24)
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
    # A JSON answer is kept (up to a bound) to compare its usage with the count.
    capture = 0 if conv.stream else USAGE_CAPTURE_BYTES
    relay: Response = Relay(sent, client_gone, capture_limit=capture, error_event=error_event)
    if prepared.context_management is not None:  # Anthropic context editing
        return context_management.WithContextManagement(
            relay, prepared.context_management, conv.stream
        )
    relay = step.wrap(relay) if step is not None else relay
    if linked is None:
        return relay
    return response_chain.keeping(svc, request.headers, linked, relay, sent, prepared, facts)


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
    return await _serve(request, _trimmed(RESPONSES), _parse_responses, chained=True)


async def _prepare_message(
    conv: Conversation, raw: bytes, headers: Mapping[str, str], svc: Services,
    facts: RequestFacts,
) -> Prepared:  # fmt: skip
    return await context_management.prepare_message(MESSAGES, conv, raw, headers, svc, facts)


async def create_message(request: Request) -> Response:
    """``POST /v1/messages``: its context edits applied, then trimmed to the budget like
    chat; errors in Anthropic's envelope, an over-long prompt in the wording agent
    clients act on."""
    try:
        return await _serve(request, _prepare_message, messages.parse_create, _anthropic_event)
    except ProxyError as exc:
        request_facts(request).error = exc.code  # for the access line
        return anthropic_response(exc)


def _anthropic_event(exc: ProxyError) -> bytes:
    return anthropic_errors.stream_error_event(exc.status, exc.message)


async def create_completion(request: Request) -> Response:
    """``POST /v1/completions``: a raw prompt, counted, capped, admitted; refused over
    the budget (``proxy.pipeline.prepare_completion``)."""
    return await _serve(request, prepare_completion, completions.parse)


async def count_message_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``, answered here: the count the Messages route
    trims by, which is the engine's (``prepare_dialect.input_tokens``)."""
    try:
        svc = services(request)
        raw = await read_body(request, svc.settings.max_body_bytes, svc.settings.body_timeout)
        conv = messages.parse(raw)
        if not conv.model:
            raise InvalidRequest("'model' is required.", param="model")
        svc = svc.for_model(conv.model)
        facts = request_facts(request)
        note_model(svc.settings.max_model_name_length, conv.model, facts, "messages")
        tokens, original = await context_management.count_message(svc, MESSAGES, conv)
    except ProxyError as exc:
        request_facts(request).error = exc.code
        return anthropic_response(exc)
    # vLLM's answer, context_management included: the count before the edits.
    body = {"input_tokens": tokens, "context_management": {"original_input_tokens": original}}
    return Response(orjson.dumps(body), media_type=JSON_MEDIA_TYPE)


def anthropic_response(exc: ProxyError) -> Response:
    return Response(
        anthropic_errors.error_body(exc),
        status_code=exc.status,
        media_type=JSON_MEDIA_TYPE,
        headers=exc.headers,
    )


def dialect_routes() -> list[Route | WebSocketRoute]:
    """The dialects' routes, ahead of the relayed rest of ``/v1/``."""
    return [
        *responses_routes(),
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
        APIRoute(
            RESPONSES_PATH + "/{response_id}",
            response_chain.retrieve_response,
            methods=["GET"],
            summary="A response this proxy stored (previous_response_id)",
            tags=["openai"],
        ),
        APIRoute(
            RESPONSES_PATH + "/{response_id}",
            response_chain.delete_response,
            methods=["DELETE"],
            summary="Delete a response this proxy stored",
            tags=["openai"],
        ),
        APIRoute(
            COUNT_TOKENS_PATH,
            count_message_tokens,
            methods=["POST"],
            summary="Anthropic Messages token count, answered by the proxy",
            tags=["anthropic"],
        ),
        APIRoute(
            COMPLETIONS_PATH,
            create_completion,
            methods=["POST"],
            summary="Completion of a raw prompt, refused over the token budget",
            tags=["openai"],
        ),
    ]
