"""The routes of the dialects beside chat: the Responses API, Anthropic Messages (and
its token count) and completions, read → parse (the dialect) → prepare → forward →
relay, as the chat route (docs/architecture.md §22). Only the parse, the render and the
error envelope are the dialect's own; a raw prompt has its own prepare step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from proxy import response_chain, truncation
from proxy.admission import MESSAGES_ANSWER, RESPONSES_ANSWER
from proxy.breakoff import sse_error_event
from proxy.compaction import route as compaction
from proxy.dependencies import Services, services
from proxy.dialects import anthropic_errors, completions, messages, messages_chat, responses
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.forward import Outgoing, forward
from proxy.logs import RequestFacts, request_facts
from proxy.prepare import Prepared, note_model
from proxy.prepare_completion import prepare_completion
from proxy.prepare_dialect import Wire, input_tokens, prepare_conversation, wire
from proxy.relay import STREAM_WATCH_DELAY, WATCH_DELAY, Relay, watch_disconnect
from proxy.responses_routes import responses_routes
from proxy.routes import USAGE_CAPTURE_BYTES, read_body
from proxy.sessions.identity import Identity
from proxy.types import JSON_MEDIA_TYPE

RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = anthropic_errors.MESSAGES_PATH
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
COMPLETIONS_PATH = "/v1/completions"

RESPONSES = wire("responses", responses.to_chat, responses.render, RESPONSES_ANSWER)
MESSAGES = wire(
    "messages", messages.to_chat, messages.render, MESSAGES_ANSWER, messages_chat.chat_tools
)


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


async def create_message(request: Request) -> Response:
    """``POST /v1/messages``: trimmed to the budget like chat; errors in Anthropic's
    envelope, an over-long prompt in the wording agent clients act on."""
    try:
        return await _serve(request, _trimmed(MESSAGES), messages.parse, _anthropic_event)
    except ProxyError as exc:
        request_facts(request).error = exc.code  # for the access line
        return anthropic_response(exc)


def _anthropic_event(exc: ProxyError) -> bytes:
    return anthropic_errors.stream_error_event(exc.status, exc.message)


async def create_completion(request: Request) -> Response:
    """``POST /v1/completions``: a raw prompt, counted, capped, admitted; refused over
    the budget (``proxy.prepare_completion``)."""
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
        tokens = await input_tokens(svc, MESSAGES, conv)
    except ProxyError as exc:
        request_facts(request).error = exc.code
        return anthropic_response(exc)
    # vLLM's answer, context_management included.
    body = {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
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
