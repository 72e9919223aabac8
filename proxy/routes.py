"""Thin handlers: parse, session, budget, count, trim, forward.

Plain Starlette routes that take the raw request and return responses directly:
FastAPI's body validation would parse every message into models, and its
dependency solving costs about 70 us a request, neither of which the hot path needs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.chat import ChatRequest, parse_chat, with_messages
from proxy.dependencies import Services, services
from proxy.errors import ContextLengthExceeded, ProxyError, RequestTooLarge
from proxy.logs import request_facts
from proxy.metrics import CONTENT_TYPE
from proxy.tokens import estimate_error
from proxy.trimming import TrimPolicy, TrimResult, trim
from proxy.types import PromptCount
from proxy.upstream import Relay, request_headers, watch_disconnect

CHAT_PATH = "/v1/chat/completions"
# A non-streaming answer up to this size is kept to compare usage with the count.
_USAGE_CAPTURE_BYTES = 1 << 20


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is {size} bytes or more; this proxy accepts at most {limit} "
        "bytes (TRIMPROXY_MAX_BODY_BYTES). Send less history or raise the limit.",
        param="messages",
    )


async def budget_for(svc: Services, chat: ChatRequest) -> int | None:
    """``min(max_prompt_tokens, context_window - reserve - 1)``; None when unbounded.

    The one token of slack is FastChat's: its worker keeps only
    ``context - max_new_tokens - 1`` prompt tokens and silently drops the first one
    of a prompt that fills the rest exactly. vLLM loses nothing by it.
    """
    settings = svc.settings
    reserve = chat.max_tokens or settings.default_completion_reserve
    window = settings.context_window
    if window is None and chat.model is not None:
        window = await svc.windows.get(chat.model)
    limits = [settings.max_prompt_tokens] if settings.max_prompt_tokens else []
    if window is not None:
        room = window - reserve - 1
        if room < 1:
            raise ContextLengthExceeded(
                f"max_tokens of {reserve} leaves no room for a prompt in the model's "
                f"context window of {window} tokens. Ask for fewer completion tokens.",
                param="max_tokens" if chat.max_tokens else None,
            )
        limits.append(room)
    return min(limits) if limits else None


async def fit(
    svc: Services, chat: ChatRequest, count: PromptCount, policy: TrimPolicy, history_start: int
) -> tuple[TrimResult, int]:
    """Trim, and prove the result fits: returns the result and the forwarded count.

    A counter whose per-message split is not additive for every subset (the chat
    template renders a message differently by position) gets the kept list recounted;
    when that is over the budget, the budget is tightened by the excess and trimmed
    again, so the budget is a guarantee, not an estimate.
    """
    result = trim(chat.messages, count, policy, history_start=history_start)
    if svc.counter.additive or len(result.kept) == len(chat.messages) or policy.budget is None:
        return result, result.tokens
    budget = policy.budget
    tightened = policy
    for _ in range(4):
        kept = [chat.messages[i] for i in result.kept]
        actual = (await svc.counter.count(kept, tools=chat.tools, model=chat.model)).total
        if actual <= budget:
            return result, actual
        tightened = replace(
            tightened, budget=(tightened.budget or budget) - (actual - result.tokens)
        )
        try:
            result = trim(chat.messages, count, tightened, history_start=history_start)
        except ContextLengthExceeded as exc:
            raise ContextLengthExceeded(
                f"This conversation needs {actual} prompt tokens even after trimming, but the "
                f"budget is {budget} tokens. Shorten the last message or the system prompt.",
                param="messages",
            ) from exc
    raise ContextLengthExceeded(
        f"The prompt could not be brought under the budget of {budget} tokens.", param="messages"
    )


async def chat_completions(request: Request) -> Response:
    svc = services(request)
    settings = svc.settings
    metrics = svc.metrics
    raw = await read_body(request, settings.max_body_bytes)
    chat = parse_chat(raw)
    facts = request_facts(request)  # for the access line
    facts.model = chat.model

    history_start = 0
    extra: dict[str, str] = {}
    if svc.sessions is not None:
        admission = await svc.sessions.admit(request, chat)
        history_start = admission.history_start
        extra.update(admission.headers)

    budget = await budget_for(svc, chat)
    count = await svc.counter.count(chat.messages, tools=chat.tools, model=chat.model)
    metrics.prompt_received.observe(count.total)
    facts.prompt_tokens_received = count.total
    policy = TrimPolicy(
        budget=budget,
        target=settings.trim_target,
        max_history_turns=settings.max_history_turns,
        pin_first_user=settings.pin_first_user,
    )
    result, forwarded_tokens = await fit(svc, chat, count, policy, history_start)
    dropped = result.dropped(len(chat.messages))
    if dropped:
        body = with_messages(chat, [chat.messages[i] for i in result.kept])
        metrics.trimmed_messages.inc(dropped)
        metrics.trimmed_tokens.inc(max(0, count.total - forwarded_tokens))
        metrics.trim_events.labels(result.reason or "budget").inc()
    else:
        body = raw  # nothing trimmed: the client's bytes, unchanged
    metrics.prompt_forwarded.observe(forwarded_tokens)
    facts.prompt_tokens_forwarded = forwarded_tokens
    facts.messages_dropped = dropped
    extra["x-trimproxy-prompt-tokens"] = str(forwarded_tokens)
    extra["x-trimproxy-trimmed-messages"] = str(dropped)

    headers = request_headers(request.scope["headers"], settings, keep_client_auth=svc.pass_auth)
    headers["content-type"] = "application/json"
    started = time.perf_counter()
    upstream, client_gone = await open_upstream(request, svc, CHAT_PATH, headers, body)

    def on_end(complete: bool, captured: bytes | None) -> None:
        if captured is not None and upstream.status == 200:
            error = estimate_error(forwarded_tokens, captured)
            if error is not None:
                metrics.estimate_error.observe(error)

    def on_first_byte() -> None:
        facts.upstream_ttfb = time.perf_counter() - started
        metrics.chat_ttfb.observe(facts.upstream_ttfb)

    return Relay(
        upstream,
        extra,
        client_gone,
        on_error=lambda kind: metrics.upstream_errors.labels(kind).inc(),
        on_end=on_end,
        on_first_byte=on_first_byte,
        capture_limit=0 if chat.stream else _USAGE_CAPTURE_BYTES,
    )


async def open_upstream(
    request: Request, svc: Services, path: str, headers: dict[str, str], body: bytes | None
) -> tuple[aiohttp.ClientResponse, asyncio.Future[None]]:
    """Forward the request; returns the upstream response and the client-disconnect
    watcher that the relay goes on using (cancelled here if forwarding fails)."""
    client_gone = watch_disconnect(request.receive)
    try:
        response = await svc.upstream.open(request.method, path, headers, body, client_gone)
    except ProxyError as exc:
        client_gone.cancel()
        if exc.kind is not None:
            svc.metrics.upstream_errors.labels(exc.kind).inc()
        raise
    except BaseException:
        client_gone.cancel()
        raise
    if response.status >= 500:
        svc.metrics.upstream_errors.labels("http_5xx").inc()
    return response, client_gone


async def passthrough(request: Request) -> Response:
    """Any other upstream route, relayed as it is (bodies streamed back unbuffered)."""
    svc = services(request)
    body = await read_body(request, svc.settings.max_body_bytes)
    path = request.url.path
    if request.url.query:
        path = f"{path}?{request.url.query}"
    headers = request_headers(
        request.scope["headers"], svc.settings, keep_client_auth=svc.pass_auth
    )
    upstream, client_gone = await open_upstream(request, svc, path, headers, body or None)
    return Relay(
        upstream,
        {},
        client_gone,
        on_error=lambda kind: svc.metrics.upstream_errors.labels(kind).inc(),
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    svc = services(request)
    if await svc.upstream.ready():
        return JSONResponse({"status": "ready", "upstream": svc.settings.upstream_url})
    return JSONResponse(
        {
            "status": "not ready",
            "upstream": svc.settings.upstream_url,
            "detail": "the upstream did not answer GET /v1/models",
        },
        status_code=503,
    )


async def metrics(request: Request) -> Response:
    return Response(services(request).metrics.render(), media_type=CONTENT_TYPE)


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]

routes = [
    Route(CHAT_PATH, chat_completions, methods=["POST"]),
    Route("/v1/{rest:path}", passthrough, methods=_METHODS),
    Route("/tokenize", passthrough, methods=["POST"]),
    Route("/detokenize", passthrough, methods=["POST"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
