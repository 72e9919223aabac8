"""The error hierarchy and the OpenAI error envelope.

Every error the proxy itself raises is a ``ProxyError`` and renders as
``{"error": {"message", "type", "param", "code"}}``. Messages are built from facts
(sizes, limits, field names), never from ``str(exc)``, so no path or trace leaks.
The HTTP client's failures are translated to these here (``upstream_failure`` on the
way to an answer's head, ``broken_off`` in its body), and counted in one place, the
``Transport.failure`` that calls them.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from proxy.types import PromptLimit


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


class InvalidType(InvalidRequest):
    """A field of the wrong JSON type: OpenAI's ``invalid_type``."""

    code = "invalid_type"


class ContextLengthExceeded(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        needed: int | None = None,
        maximum: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        #: The prompt tokens the request needs at the least, when known.
        self.needed = needed
        #: The prompt budget it is over, when known (Anthropic's wording names it).
        self.maximum = maximum


def context_length_exceeded(
    needed: int, limit: PromptLimit, *, at_least: bool = False, raw_prompt: bool = False
) -> ContextLengthExceeded:
    """The one 400 for a prompt that cannot fit even after trimming: ``needed`` is
    the least the request needs (its system block and last turn; a lower bound when
    ``at_least``), ``limit`` the budget it is over and where that comes from.

    Worded the way OpenAI and vLLM word theirs ("This model's maximum context length
    is N tokens. However, your messages resulted in M tokens."), which clients match
    to recognise a context-window error (the LiteLLM SDK's
    ``context_window_fallbacks``), then the advice for the limit that really binds:
    the window less the completion reserve, or ``TRIMPROXY_MAX_PROMPT_TOKENS``.
    ``raw_prompt``: a completions prompt (``/v1/completions``), which has no turns.
    """
    resulted = f"{'at least ' if at_least else ''}{needed} tokens"
    dropped = "even with every earlier turn dropped (the system messages and the last turn)"
    subject, shorten, param = "messages", "the last message or the system prompt", "messages"
    if raw_prompt:
        dropped = "and a raw prompt has no turns to drop"
        subject, shorten, param = "prompt", "the prompt", "prompt"
    if limit.window is None or limit.setting_binds:
        named = " (TRIMPROXY_MAX_PROMPT_TOKENS)" if limit.setting_binds else ""
        return ContextLengthExceeded(
            f"This model's maximum context length is {limit.budget} tokens for prompts "
            f"through this proxy{named}. However, your {subject} resulted in {resulted}, "
            f"{dropped}. Shorten {shorten}; asking for fewer completion tokens would not help.",
            param=param,
            needed=needed,
            maximum=limit.budget,
        )
    if limit.reserve_asked:
        reserved = f"{limit.reserve} tokens of max_tokens"
    elif limit.reserve_setting == "TRIMPROXY_MAX_COMPLETION_TOKENS":
        reserved = (
            f"{limit.reserve} tokens for the answer (TRIMPROXY_MAX_COMPLETION_TOKENS, the cap)"
        )
    else:
        reserved = (
            f"{limit.reserve} tokens for the answer ({limit.reserve_setting}, as the request "
            "names no max_tokens)"
        )
    return ContextLengthExceeded(
        f"This model's maximum context length is {limit.window} tokens. However, your "
        f"{subject} resulted in {resulted}, {dropped}, and {reserved} leave "
        f"{max(limit.budget, 0)} for the prompt. Shorten {shorten}, or ask for fewer "
        "completion tokens (max_tokens).",
        param=param,
        needed=needed,
        maximum=limit.budget,
    )


def no_room_for_prompt(window: int, reserve: int, setting: str | None) -> ContextLengthExceeded:
    """The 400 for a completion reserve that leaves the prompt no room at all;
    ``setting`` names where the reserve comes from (None: the request's max_tokens)."""
    return ContextLengthExceeded(
        f"This model's maximum context length is {window} tokens. However, you "
        f"requested {reserve} completion tokens ({setting or 'max_tokens'}), which leaves "
        "no room for the prompt. Ask for fewer completion tokens.",
        param="max_tokens" if setting is None else None,
    )


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


class ResponseStoreUnavailable(ProxyError):
    status = 503
    type = "server_error"
    code = "response_store_unavailable"


class ResponseNotFound(ProxyError):
    """``GET``/``DELETE /v1/responses/{id}`` of a response this proxy does not hold."""

    status = 404
    type = "invalid_request_error"
    code = "response_not_found"


class PreviousResponseNotFound(ProxyError):
    """A ``previous_response_id`` this proxy does not hold: OpenAI's 400 and code, which
    agent clients act on (they send the whole conversation again)."""

    status = 400
    type = "invalid_request_error"
    code = "previous_response_not_found"


class ClientClosedRequest(ProxyError):
    """The client left before the answer; nobody reads this one (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class UpstreamUnavailable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class NoEngineAvailable(ProxyError):
    """Every engine of the request's upstream is out of the rotation (docs/engines.md)."""

    status = 503
    type = "upstream_error"
    code = "no_engine_available"


def no_engine_available(engines: int, where: str, interval: float) -> NoEngineAvailable:
    """The 503 for a request none of whose ``engines`` (of ``where``, the setting) is
    up; ``Retry-After`` is the health probe's interval, 1 to 30 s."""
    return NoEngineAvailable(
        f"None of the {engines} engines of {where} is up (each failed to connect or its "
        f"health probe); they are probed every {interval:g} s at most "
        "(TRIMPROXY_HEALTH_INTERVAL). Retry shortly.",
        headers={"retry-after": str(max(1, min(30, round(interval))))},
    )


class UpstreamProtocolError(ProxyError):
    """The upstream was reached but its answer was not valid HTTP the proxy can relay:
    a status outside 100-599, a header that is not Latin-1, a body cut off."""

    status = 502
    type = "upstream_error"
    code = "upstream_protocol_error"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class RequestTimeout(ProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class UnsupportedEncoding(ProxyError):
    """A prompt route's body under a ``Content-Encoding`` (``proxy.guards``)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class MethodNotAllowed(ProxyError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RouteNotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MisspelledRoute(RouteNotFound):
    """A path that spells a prompt route without being it (``proxy.paths``); answered
    in the envelope of the route it spells."""

    def __init__(self, message: str, route: str) -> None:
        super().__init__(message)
        self.route = route


def envelope(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def upstream_failure(
    exc: BaseException, upstream_url: str, timeout: float, connect_timeout: float | None = None
) -> ProxyError:
    """Map an aiohttp/asyncio failure talking to the upstream to a 502 or 504.

    ``upstream_url`` is the operator's own setting, safe to name; the exception text
    is not used (it can carry resolver or socket details). The message says which
    of the three happened: no connection, a connection that answered nonsense, or an
    answer that did not come in time (and which timeout that was).
    """
    kind = upstream_error_kind(exc)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        limit = f" within {connect_timeout:g} s" if connect_timeout is not None else ""
        return UpstreamTimeout(
            f"Could not connect to the upstream at {upstream_url}{limit} "
            "(TRIMPROXY_CONNECT_TIMEOUT). Check that the model server is running and "
            "reachable from the proxy.",
            kind=kind,
        )
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamTimeout(
            f"The upstream at {upstream_url} sent nothing for {timeout:g} s "
            "(TRIMPROXY_READ_TIMEOUT). Retry later; if it keeps happening, the model "
            "server is overloaded or TRIMPROXY_READ_TIMEOUT is too short.",
            kind=kind,
        )
    if kind == "protocol":
        return protocol_error(upstream_url, "an answer that is not valid HTTP")
    if kind == "disconnected":
        return closed_before_answer(upstream_url)
    return UpstreamUnavailable(
        f"The upstream at {upstream_url} could not be reached. Check that the model "
        "server is running and that TRIMPROXY_UPSTREAM_URL points at it.",
        kind=kind,
    )


def closed_before_answer(upstream_url: str, then: str | None = None) -> UpstreamUnavailable:
    """The 502 for an upstream that took the request and closed the connection before
    any of its answer came (it exited, restarted or dropped the connection while
    answering); ``then``: what the one retry on a fresh connection met."""
    after = f", {then}" if then else ""
    return UpstreamUnavailable(
        f"The upstream at {upstream_url} closed the connection mid-answer, before any of "
        f"its answer came{after}. The model server may have exited or restarted while "
        "answering: check its logs, and retry.",
        kind="disconnected",
    )


def deadline_passed(upstream_url: str, timeout: float, spent: float) -> UpstreamTimeout:
    """The 504 for a request whose counting and answer together outlasted the read
    timeout: the two share one deadline (docs/architecture.md §20)."""
    return UpstreamTimeout(
        f"The upstream at {upstream_url} did not answer within {timeout:g} s "
        f"(TRIMPROXY_READ_TIMEOUT), counting the prompt included: preparing the request "
        f"(its token count, with the upstream's POST /tokenize where that is the counter) "
        f"took {spent:.1f} s of it, and the answer did not start in the rest. Retry later; "
        "if it keeps happening, the model server is overloaded or stuck.",
        kind="timeout",
    )


def broken_off(exc: BaseException, where: str) -> ProxyError:
    """The error for an upstream at ``where`` (its origin) that broke off mid-answer:
    timed out, or cut short."""
    kind = upstream_error_kind(exc)
    if kind == "timeout":
        return UpstreamTimeout(
            f"The upstream at {where} stopped sending its answer for longer than the read "
            "timeout (TRIMPROXY_READ_TIMEOUT). Retry; if it keeps happening, the model "
            "server is overloaded or stuck.",
            kind=kind,
        )
    return UpstreamProtocolError(
        f"The upstream at {where} was reached but answered something invalid (its answer "
        "broke off before the end). Retry; if it keeps happening, check the model "
        "server's logs.",
        kind=kind,
    )


def protocol_error(upstream_url: str, what: str) -> UpstreamProtocolError:
    """The 502 for an upstream that was reached but answered ``what``."""
    return UpstreamProtocolError(
        f"The upstream at {upstream_url} was reached but answered something invalid "
        f"({what}), which the proxy does not relay. Check the model server (or whatever "
        "sits between it and the proxy) and its logs.",
        kind="protocol",
    )


def upstream_error_kind(exc: BaseException) -> str:
    """A bounded label for ``trimproxy_upstream_errors_total{kind}``."""
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        return "disconnected"  # a reset or a close: the connection was open
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        # A body cut short, a malformed status line or header: the server answered,
        # but not in HTTP.
        return "protocol"
    return "other"
