"""Pure ASGI middleware: accounting, API keys, the in-flight limit.

None of them reads the request body; they look at the scope and wrap ``send``.
"""

from __future__ import annotations

import hmac
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import InvalidApiKey, Overloaded, ProxyError
from proxy.logs import (
    ACCESS_LOGGER,
    FACTS_KEY,
    REQUEST_ID_HEADER,
    SESSION_ID_HEADER,
    RequestFacts,
    ensure_request_id,
)
from proxy.metrics import Metrics, route_label

_GUARDED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


async def send_error(send: Send, error: ProxyError) -> None:
    headers = [(b"content-type", b"application/json")]
    headers.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    body = error.body()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# Scrapes and probes arrive every few seconds; their access lines are debug-level.
_QUIET_ROUTES = frozenset(("/metrics", "/healthz", "/readyz"))


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
        self.access = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        route = route_label(path)
        status = 500
        start = time.perf_counter()
        request_id, headers = ensure_request_id(scope["headers"])
        if headers is not None:
            scope = {**scope, "headers": headers}
        facts = RequestFacts(request_id)
        scope.setdefault("state", {})[FACTS_KEY] = facts
        rid_header = (REQUEST_ID_HEADER, request_id.encode("ascii"))

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                out = [rid_header]
                for header in message.get("headers", ()):
                    if header[0] == SESSION_ID_HEADER and facts.session_id is None:
                        facts.session_id = header[1].decode("latin-1")
                    if header[0] != REQUEST_ID_HEADER:  # an upstream's echo of it
                        out.append(header)
                message = {**message, "headers": out}
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - start
            self.metrics.in_flight.dec()
            self.metrics.answered(route, status, elapsed)
            level = logging.DEBUG if route in _QUIET_ROUTES else logging.INFO
            if self.access.isEnabledFor(level):
                fields = facts.fields(scope["method"], path, status, elapsed)
                # makeRecord + handle: Logger.log would walk the stack for a caller
                # that the JSON line does not show.
                self.access.handle(
                    self.access.makeRecord(
                        ACCESS_LOGGER, level, "", 0, "request", (), None, extra={"fields": fields}
                    )
                )


class ApiKeys:
    """Requires ``Authorization: Bearer <key>`` from a configured set on proxied routes.

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
        presented = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    presented = token.strip()
                break
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(presented, key)
        if not matched:
            reason = "was missing" if not presented else "is not valid"
            await send_error(
                send,
                InvalidApiKey(
                    f"The API key {reason}. Send 'Authorization: Bearer <key>' with a key "
                    "that this proxy's operator issued (TRIMPROXY_API_KEYS)."
                ),
            )
            return
        await self.app(scope, receive, send)


class InFlightLimit:
    """Answers 429 with Retry-After once ``limit`` proxied requests are in flight."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.current = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        if self.current >= self.limit:
            await send_error(
                send,
                Overloaded(
                    f"The proxy is serving its limit of {self.limit} concurrent requests "
                    "(TRIMPROXY_MAX_IN_FLIGHT). Retry after a second.",
                    headers={"retry-after": "1"},
                ),
            )
            return
        self.current += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.current -= 1
