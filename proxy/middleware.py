"""Pure ASGI middleware: accounting, API keys, the in-flight limit.

None of them reads the request body; they look at the scope and wrap ``send``.
"""

from __future__ import annotations

import hmac
import logging
import time
from urllib.parse import quote, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.dialects import anthropic_errors
from proxy.dialects.anthropic_errors import speaks_anthropic
from proxy.errors import (
    InvalidApiKey,
    InvalidRequest,
    MisspelledRoute,
    Overloaded,
    ProxyError,
    UnsupportedEncoding,
)
from proxy.guards import prompt_guard
from proxy.logs import (
    FACTS_KEY,
    REQUEST_ID_HEADER,
    AccessLog,
    RequestFacts,
    ensure_request_id,
)
from proxy.metrics import KNOWN_ROUTES, Metrics, route_label
from proxy.paths import BadPath, route, spelled_prompt_path
from proxy.pipeline.breakoff import RelayAborted
from proxy.types import JSON_MEDIA_TYPE

_GUARDED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


async def send_error(send: Send, error: ProxyError, path: str) -> None:
    """``error`` answered in the envelope of ``path``'s API (OpenAI's, or Anthropic's
    on the Messages paths)."""
    headers = [(b"content-type", JSON_MEDIA_TYPE.encode())]
    headers.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    body = anthropic_errors.error_body(error) if speaks_anthropic(path) else error.body()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# Scrapes and probes arrive every few seconds; their access lines are debug-level.
_QUIET_ROUTES = frozenset(("/metrics", "/healthz", "/readyz"))
# The proxy's own route names as clients send them: already in normal form (no dot
# segments, escapes or repeated slashes), so routing them cannot change them.
_NORMAL_PATHS = frozenset(path.encode("ascii") for path in KNOWN_ROUTES)


def routed_scope(scope: Scope) -> Scope:
    """The scope with its path in normal form (``proxy.paths``), routed and forwarded
    as such; raises ``InvalidRequest`` for a path the rule refuses, ``MisspelledRoute``
    for another spelling of a prompt route.

    ``raw_path`` is what the client sent, undecoded (ASGI servers set it); the
    decoded ``path`` is rebuilt from the normal form, so the router and the
    handlers, the API-key check and the metrics all see the same path.
    """
    raw_path: bytes | None = scope.get("raw_path")
    if raw_path in _NORMAL_PATHS:
        return scope  # what route() would say, without its cost on every request
    raw = raw_path.decode("latin-1") if raw_path else quote(scope["path"])
    try:
        routed = route(raw)
    except BadPath as exc:
        raise InvalidRequest(exc.reason) from None
    spelled = spelled_prompt_path(routed.path)
    if spelled is not None:
        raise MisspelledRoute(
            f"This proxy serves the prompt route {spelled} only under that exact path; "
            "it does not forward other spellings of it. Send the request to "
            f"{spelled}.",
            spelled,
        )
    if not routed.changed and raw_path:
        return scope
    return {**scope, "path": unquote(routed.path), "raw_path": routed.path.encode("ascii")}


def body_complete(message: Message) -> bool:
    """Whether ``message`` is the last of the request body (a request counts as in
    flight from then on: a client still sending its body holds no slot)."""
    return message["type"] == "http.request" and not message.get("more_body", False)


class _Answer:
    """Accounting's ``send``: notes the status and puts the request id in the head.

    After the head it only passes messages on, so it names the ``send`` it passes them
    to as ``body_send``: the relay sends a body's chunks there (one call less per
    chunk). Every middleware outside Accounting still sees every byte; one inside it
    that wraps ``send`` hands the relay its own wrapper, which has no ``body_send``.
    """

    __slots__ = ("body_send", "rid_header", "status")

    def __init__(self, send: Send, rid_header: tuple[bytes, bytes]) -> None:
        self.body_send = send
        self.rid_header = rid_header
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            out = [self.rid_header]
            for header in message.get("headers", ()):
                if header[0] != REQUEST_ID_HEADER:  # an upstream's echo of it
                    out.append(header)
            message = {**message, "headers": out}
        await self.body_send(message)


class Accounting:
    """Counts every answered request by route and status, with its duration, and
    writes its access line.

    It also settles the request id: the client's ``X-Request-ID`` when valid, else a
    generated one, put into the headers the handlers forward upstream and into the
    response. Outermost, so it sees the 401s and 429s of the middleware inside it.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.access = AccessLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            scope = prompt_guard(routed_scope(scope))
        except (InvalidRequest, MisspelledRoute, UnsupportedEncoding) as exc:
            refused: ProxyError | None = exc
        else:
            refused = None
        path: str = scope["path"]
        route = route_label(path)
        request_id, headers = ensure_request_id(scope["headers"])
        if headers is not None:
            scope = {**scope, "headers": headers}
        facts = RequestFacts(request_id)
        state = scope.setdefault("state", {})
        state[FACTS_KEY] = facts
        answer = _Answer(send, (REQUEST_ID_HEADER, request_id.encode("ascii")))
        in_flight = False

        async def receive_wrapper() -> Message:
            nonlocal in_flight
            message = await receive()
            if not in_flight and body_complete(message):
                in_flight = True
                self.metrics.in_flight.inc()
            return message

        try:
            if refused is not None:
                facts.error = refused.code
                spelled = refused.route if isinstance(refused, MisspelledRoute) else path
                await send_error(answer, refused, spelled)
            else:
                await self.app(scope, receive_wrapper, answer)
        except RelayAborted as exc:
            facts.error = str(exc)  # the status went out as 200; the line says it broke off
            raise
        finally:
            elapsed = time.perf_counter() - start
            if in_flight:
                self.metrics.in_flight.dec()
            status = answer.status
            self.metrics.answered(route, status, elapsed)
            level = logging.DEBUG if route in _QUIET_ROUTES else logging.INFO
            if self.access.enabled(level):
                self.access.write(level, facts.fields(scope["method"], path, status, elapsed))


class ApiKeys:
    """Requires a key from a configured set on proxied routes: ``Authorization: Bearer
    <key>`` (OpenAI's clients), or ``X-Api-Key: <key>`` (Anthropic's); the bearer token
    is the one checked when a request sends both.

    Every configured key is compared, in constant time, so the answer's timing says
    nothing about which key nearly matched.
    """

    def __init__(self, app: ASGIApp, keys: frozenset[str]) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        bearer: bytes | None = None
        api_key: bytes | None = None
        scheme = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    bearer = token.strip()
            elif name == b"x-api-key":
                api_key = value.strip()
        presented = bearer if bearer is not None else (api_key or b"")
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(presented, key)
        if not matched:
            await send_error(send, InvalidApiKey(_refusal(presented, scheme)), scope["path"])
            return
        await self.app(scope, receive, send)


def _refusal(presented: bytes, scheme: bytes) -> str:
    """Why a request's key was refused, and what to send instead."""
    send = (
        "Send 'Authorization: Bearer <key>' (or 'X-Api-Key: <key>') with a key that this "
        "proxy's operator issued (TRIMPROXY_API_KEYS)."
    )
    if presented:
        return f"The API key is not valid. {send}"
    if scheme and scheme.lower() != b"bearer":
        shown = scheme.decode("latin-1")
        if _echoable(shown):
            return f"The Authorization scheme must be Bearer, not {shown}. {send}"
        return f"The Authorization scheme must be Bearer. {send}"
    return f"The API key was missing. {send}"


def _echoable(scheme: str) -> bool:
    return len(scheme) <= 32 and scheme.isascii() and scheme.isalnum()


class InFlightLimit:
    """Answers 429 with Retry-After once ``limit`` proxied requests are in flight.

    A request enters once its body is in: the check runs in the ``receive`` that
    hands the handler the body's last chunk, and the 429 is raised from there into
    the handler (the app's error handler answers it). Slow uploads never hold a slot.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.current = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        entered = False

        async def receive_wrapper() -> Message:
            nonlocal entered
            message = await receive()
            if not entered and body_complete(message):
                if self.current >= self.limit:
                    raise Overloaded(
                        f"The proxy is serving its limit of {self.limit} concurrent requests "
                        "(TRIMPROXY_MAX_IN_FLIGHT). Retry after a second.",
                        headers={"retry-after": "1"},
                    )
                self.current += 1
                entered = True
            return message

        try:
            await self.app(scope, receive_wrapper, send)
        finally:
            if entered:
                self.current -= 1
