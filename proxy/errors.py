"""The error hierarchy and the OpenAI error envelope.

Every error the proxy itself raises is a ``ProxyError`` and renders as
``{"error": {"message", "type", "param", "code"}}``. Messages are built from facts
(sizes, limits, field names), never from ``str(exc)``, so no path or trace leaks.
The HTTP client's failures are translated to these in one place: ``upstream_failure``.
"""

from __future__ import annotations

import aiohttp
import orjson


class ProxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        #: for upstream failures, the bounded ``kind`` label of the error metric
        self.kind = kind

    def body(self) -> bytes:
        return envelope(self.message, self.type, self.code, self.param)


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextLengthExceeded(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"


class RequestTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class InvalidApiKey(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class SessionTurnLimit(ProxyError):
    status = 409
    type = "invalid_request_error"
    code = "session_turn_limit"


class SessionExpired(ProxyError):
    status = 409
    type = "invalid_request_error"
    code = "session_expired"


class Overloaded(ProxyError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"


class SessionStoreUnavailable(ProxyError):
    status = 503
    type = "server_error"
    code = "session_store_unavailable"


class ClientClosedRequest(ProxyError):
    """The client left before the answer; nobody reads this one (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class UpstreamUnavailable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def envelope(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def upstream_failure(exc: BaseException, upstream_url: str, timeout: float) -> ProxyError:
    """Map an aiohttp/asyncio failure talking to the upstream to a 502 or 504.

    ``upstream_url`` is the operator's own setting, safe to name; the exception text
    is not used (it can carry resolver or socket details).
    """
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamTimeout(
            f"The upstream at {upstream_url} did not answer within {timeout:g} s. "
            "Retry later; if it keeps happening, the model server is overloaded or "
            "TRIMPROXY_READ_TIMEOUT is too short.",
            kind=upstream_error_kind(exc),
        )
    return UpstreamUnavailable(
        f"The upstream at {upstream_url} could not be reached. Check that the model "
        "server is running and that TRIMPROXY_UPSTREAM_URL points at it.",
        kind=upstream_error_kind(exc),
    )


def upstream_error_kind(exc: BaseException) -> str:
    """A bounded label for ``trimproxy_upstream_errors_total{kind}``."""
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    return "other"
