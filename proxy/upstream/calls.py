"""What the upstream's answers mean: the records and readers shared by the transport,
the client and the callers (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from proxy.engines.served import ServedModel
from proxy.errors import ProxyError


class UpstreamCallFailed(Exception):
    """One of the proxy's own calls (``/tokenize``, ``/metrics``, …) did not succeed.

    ``status`` is the HTTP status when the upstream answered, None when it was not
    reached or timed out; ``reason`` is a short bounded word for logs and states
    (``http_404``, ``http_error``, ``too_large``, ``unparsable``, or the transport
    error's class name).
    """

    def __init__(self, path: str, status: int | None, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Tokenized:
    """What vLLM's ``POST /tokenize`` answered."""

    count: int
    max_model_len: int | None

    @classmethod
    def read(cls, data: object) -> Tokenized:
        """The answer's ``count`` (else its ``tokens``) and ``max_model_len``."""
        if not isinstance(data, dict):
            raise UpstreamCallFailed("/tokenize", 200, "unparsable")
        count = data.get("count")
        if not isinstance(count, int):
            tokens = data.get("tokens")
            if not isinstance(tokens, list):
                raise UpstreamCallFailed("/tokenize", 200, "unparsable")
            count = len(tokens)
        limit = data.get("max_model_len")
        return cls(count, limit if isinstance(limit, int) and limit > 0 else None)


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: str
    engines_up: int = 1
    engines: int = 1


def invalid_head(response: aiohttp.ClientResponse) -> str | None:
    """What is wrong with an answer's head that the proxy cannot relay, or None.

    aiohttp accepts any three-digit status and decodes header values as UTF-8; an
    ASGI server can send neither a status outside 100-599 nor a header that is not
    Latin-1, and would drop the connection instead.
    """
    if not 100 <= response.status <= 599:
        return f"HTTP status {response.status}"
    for value in response.headers.values():
        if not value.isascii():
            try:
                value.encode("latin-1")
            except UnicodeEncodeError:
                return "a header value that is not Latin-1"
    return None


def parse_models(data: Any) -> tuple[ServedModel, ...]:
    """The one reader of a ``/v1/models`` body; entries without an ``id`` are skipped."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return ()
    out: list[ServedModel] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        root = entry.get("root")
        length = entry.get("max_model_len")
        out.append(
            ServedModel(
                id=entry["id"],
                root=root if isinstance(root, str) and root else None,
                max_model_len=length
                if isinstance(length, int) and not isinstance(length, bool) and length > 0
                else None,
            )
        )
    return tuple(out)


def connection_failed(exc: BaseException) -> bool:
    """Whether a forwarding failure happened before anything was sent: the connection
    was refused or did not open in time. Only such a request may go to another engine
    (one whose bytes went out may have been acted on)."""
    cause = exc.__cause__ if isinstance(exc, ProxyError) else exc
    return isinstance(cause, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))


def dropped(exc: BaseException) -> bool:
    """Whether a request failed on an open connection before any of its answer came:
    the engine closed or reset it (an idle kept-alive connection it was just closing,
    or an engine that exited while answering)."""
    cause = exc.__cause__ if isinstance(exc, ProxyError) else exc
    return isinstance(
        cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
    ) and not isinstance(cause, aiohttp.ClientConnectorError)


def unanswered(exc: BaseException) -> bool:
    """Whether nothing of the answer came from the engine: the connection failed
    (``connection_failed``) or was closed before the answer's head (``dropped``).
    Nothing was relayed, so the request may go to another engine."""
    return connection_failed(exc) or dropped(exc)


def call_unreached(exc: BaseException) -> bool:
    """Whether one of the proxy's own calls got no answer at all (the next engine may
    have one); an engine that answered with an error status would answer the same."""
    return isinstance(exc, UpstreamCallFailed) and exc.status is None
