"""A request handed to the app itself, in this process: what a Responses WebSocket
message (``proxy.responses_socket``) and a compaction summary
(``proxy.compaction.summary``) become, so that each gets everything an HTTP request
gets (API keys, count, trim, sessions, admission, metrics, the access line;
docs/architecture.md §24)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from starlette.types import ASGIApp, Message, Scope

#: The client's headers that describe its own connection or body, not the request.
_DROPPED = frozenset(
    (b"content-length", b"content-type", b"transfer-encoding", b"connection", b"upgrade")
)

Sink = Callable[[Message], Awaitable[None]]


def headers_of(raw: Iterable[tuple[bytes, bytes]], size: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in raw if k not in _DROPPED and not k.startswith(b"sec-websocket-")]
    return [*kept, (b"content-type", b"application/json"), (b"content-length", str(size).encode())]


async def call(
    app: ASGIApp, origin: Scope, path: str, body: bytes, sink: Sink, gone: asyncio.Event
) -> None:
    """POST ``body`` to ``path`` of ``app`` as the client of ``origin`` (its headers,
    address and state); every message of the answer goes to ``sink``; the client
    counts as gone when ``gone`` is set."""
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https" if origin.get("scheme") in ("wss", "https") else "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": origin.get("root_path", ""),
        "headers": headers_of(origin.get("headers", []), len(body)),
        "client": origin.get("client"),
        "server": origin.get("server"),
        "state": dict(origin.get("state", {})),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    await app(scope, receive, sink)


async def fetch(app: ASGIApp, origin: Scope, path: str, body: bytes) -> tuple[int, bytes]:
    """The status and whole body of a request handed to ``app``."""
    status = 500
    parts: list[bytes] = []

    async def sink(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    gone = asyncio.Event()
    try:
        await call(app, origin, path, body, sink, gone)
    finally:
        gone.set()
    return status, b"".join(parts)
