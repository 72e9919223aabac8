"""Anthropic's error envelope, for answers on the Messages route.

``{"type": "error", "error": {"type", "message"}}``, the type from the HTTP status as
Anthropic's API reference lists them (400 and every unlisted 4xx
``invalid_request_error``; 503 as ``overloaded_error``, which clients retry like 529).
Every answer the proxy itself gives on an Anthropic path (``speaks_anthropic``) is in
it: the route's own, and those of the middleware in front of every route (a refused
key, the in-flight limit, a refused path), so an Anthropic client reads them all.
"""

from __future__ import annotations

import orjson

from proxy.errors import ContextLengthExceeded, ProxyError

#: The Messages API's paths: ``/v1/messages`` and everything under it.
MESSAGES_PATH = "/v1/messages"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def envelope(status: int, message: str) -> bytes:
    error = {"type": error_type(status), "message": message}
    return orjson.dumps({"type": "error", "error": error})


def stream_error_event(status: int, message: str) -> bytes:
    """The final event of a Messages stream that broke off: Anthropic's ``error`` event,
    which its SDK raises on (vLLM's Messages route sends the same shape)."""
    return b"event: error\ndata: " + envelope(status, message) + b"\n\n"


def too_long_message(tokens: int, maximum: int) -> str:
    """Anthropic's wording for a prompt over the context window, which agent clients
    match (Claude Code compacts the conversation on it)."""
    return f"prompt is too long: {tokens} tokens > {maximum} maximum"


def speaks_anthropic(path: str) -> bool:
    """Whether ``path`` (in normal form) is one of the Messages API's."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_body(exc: ProxyError) -> bytes:
    """``exc`` in Anthropic's envelope; a prompt over the window in the wording agent
    clients act on."""
    message = exc.message
    if isinstance(exc, ContextLengthExceeded) and exc.needed and exc.maximum:
        message = too_long_message(exc.needed, exc.maximum)
    return envelope(exc.status, message)
