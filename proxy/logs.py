"""Structured logs: JSON lines, request ids, and the one access line per request.

Every log record is written as one JSON object per line (``JsonFormatter``). The
access line (logger ``trimproxy.access``) carries numbers and ids only: prompt
token counts, messages dropped, status, timings, a hash of the session id; never
message content. Handlers put their facts on ``RequestFacts``, which the
``Accounting`` middleware creates per request and logs when the answer is done.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request

from proxy.choices import Endpoint

ACCESS_LOGGER = "trimproxy.access"
REQUEST_ID_HEADER = b"x-request-id"
FACTS_KEY = "trimproxy_facts"
# What a client may choose as its request id: short, and safe in logs and headers.
_VALID_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,128}")
_MAX_FIELD = 256
# A stored response's id is all another client of the same key needs to read it: the
# access line writes its hash, as it does a session id's.
_RESPONSE_PATH = "/v1/responses/"


@dataclass(slots=True)
class RequestFacts:
    """What one request did, as far as the access line needs to know."""

    request_id: str
    model: str | None = None
    prompt_tokens_received: int | None = None
    prompt_tokens_forwarded: int | None = None
    messages_dropped: int | None = None
    upstream_ttfb: float | None = None
    session_id: str | None = None
    """The session id in clear; only its hash is logged."""
    error: str | None = None
    """The proxy's own error code, when it answered with one."""
    engine: str | None = None
    """The engine the request was sent to (``host:port``)."""
    endpoint: Endpoint | None = None
    """The API a prompt came in by; None for the relayed
    routes, which carry no prompt the proxy reads."""
    continued: str | None = None
    """Each continuation of a streamed answer: ``reason@engine``, comma-separated."""
    response_id: str | None = None
    """The id a Responses answer is stored under, in clear; only its hash is logged."""

    def fields(self, method: str, path: str, status: int, duration: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "method": method,
            "path": _logged_path(path)[:_MAX_FIELD],
            "status": status,
            "duration_ms": round(duration * 1000.0, 3),
        }
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        if self.model is not None:
            out["model"] = self.model[:_MAX_FIELD]
        if self.prompt_tokens_received is not None:
            out["prompt_tokens_received"] = self.prompt_tokens_received
        if self.prompt_tokens_forwarded is not None:
            out["prompt_tokens_forwarded"] = self.prompt_tokens_forwarded
        if self.messages_dropped is not None:
            out["messages_dropped"] = self.messages_dropped
        if self.upstream_ttfb is not None:
            out["upstream_ttfb_ms"] = round(self.upstream_ttfb * 1000.0, 3)
        if self.session_id:
            out["session"] = session_hash(self.session_id)
        if self.response_id:
            out["response"] = session_hash(self.response_id)
        if self.error is not None:
            out["error"] = self.error
        if self.engine is not None:
            out["engine"] = self.engine
        if self.continued is not None:
            out["continued"] = self.continued
        return out


def _logged_path(path: str) -> str:
    """``/v1/responses/{id}[/...]`` with the id's hash in its place."""
    if not path.startswith(_RESPONSE_PATH):
        return path
    rid, sep, rest = path[len(_RESPONSE_PATH) :].partition("/")
    return f"{_RESPONSE_PATH}h:{session_hash(rid)}{sep}{rest}"


def request_facts(request: Request) -> RequestFacts:
    """This request's facts; a detached record when no ``Accounting`` wraps the app."""
    state = request.scope.get("state")
    facts = state.get(FACTS_KEY) if isinstance(state, dict) else None
    return facts if isinstance(facts, RequestFacts) else RequestFacts("")


def session_hash(session_id: str) -> str:
    """A short, stable digest: correlates a session's lines across workers and
    replicas without writing the id (a user name, a client's key fingerprint) itself."""
    return hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()


def ensure_request_id(
    headers: list[tuple[bytes, bytes]],
) -> tuple[str, list[tuple[bytes, bytes]] | None]:
    """The request id to use, and the headers to forward if they must change.

    A client's single valid ``X-Request-ID`` is kept as it is (headers unchanged:
    None). A missing, repeated or malformed one is replaced by a generated id, so
    that the upstream, the response and the log line all carry the same one.
    """
    found: list[bytes] = [value for name, value in headers if name == REQUEST_ID_HEADER]
    if len(found) == 1 and _VALID_REQUEST_ID.fullmatch(found[0]):
        return found[0].decode("ascii"), None
    # An id correlates lines, it guards nothing: Mersenne bits are unique enough and
    # cost no getrandom(2) call per request (secrets.token_hex does one).
    generated = f"{random.getrandbits(128):032x}"
    kept = [h for h in headers if h[0] != REQUEST_ID_HEADER] if found else list(headers)
    kept.append((REQUEST_ID_HEADER, generated.encode("ascii")))
    return generated, kept


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        return self.format_bytes(record).decode()

    _second: int = -1
    _second_text: str = ""

    def _timestamp(self, created: float, msecs: float) -> str:
        # strftime once a second, not once a line: the access line is on every request.
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(msecs):03d}Z"

    def format_bytes(self, record: logging.LogRecord) -> bytes:
        fields = getattr(record, "fields", None)
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created,
            record.msecs,
            record.levelname,
            record.name,
            record.getMessage(),
            fields if isinstance(fields, dict) else None,
            exc,
        )

    def line(
        self,
        created: float,
        msecs: float,
        levelname: str,
        name: str,
        msg: str,
        fields: dict[str, Any] | None = None,
        exc: str | None = None,
    ) -> bytes:
        """One line's JSON (no newline): what ``format_bytes`` writes for a record."""
        out: dict[str, Any] = {
            "ts": self._timestamp(created, msecs),
            "level": levelname.lower(),
            "logger": name,
            "msg": msg,
        }
        if fields is not None:
            out.update(fields)
        if exc is not None:
            out["exc"] = exc
        return orjson.dumps(out, default=str)


class JsonLineHandler(logging.Handler):
    """Writes each record as one JSON line straight to a file descriptor.

    One ``os.write`` per line, no text layer: the access line is written on every
    request, and a ``StreamHandler`` over ``sys.stderr`` (encode, write, flush)
    costs several times more. Lines of up to PIPE_BUF bytes from several workers
    sharing the descriptor do not interleave.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.formatter_json = JsonFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            os.write(self.fd, self.formatter_json.format_bytes(record) + b"\n")
        except Exception:
            self.handleError(record)

    def write_line(self, line: bytes) -> None:
        """One formatted line (``JsonFormatter.line``), as ``emit`` writes it."""
        os.write(self.fd, line + b"\n")


class AccessLog:
    """Writes the access line of each answered request (logger ``trimproxy.access``).

    Through logging, as every line goes, unless logging is as ``setup_logging`` left
    it: one ``JsonLineHandler`` at the root and no other handler or filter on the way
    (a test's capture, an operator's own configuration: then logging has it all). In
    that case the same bytes go straight to the handler's descriptor, without a
    ``LogRecord`` and the walk of the handler chain, most of the line's cost, on every
    request (docs/performance.md §6).
    """

    def __init__(self) -> None:
        self.logger = logging.getLogger(ACCESS_LOGGER)

    def enabled(self, level: int) -> bool:
        return self.logger.isEnabledFor(level)

    def write(self, level: int, fields: dict[str, Any]) -> None:
        """Log one access line; call only when ``enabled(level)``."""
        handler = self._plain_handler(level)
        if handler is not None:
            now = time.time()
            name = logging.getLevelName(level)
            line = handler.formatter_json.line(
                now, (now - int(now)) * 1000, name, ACCESS_LOGGER, "request", fields
            )
            try:
                handler.write_line(line)
                return
            except OSError:
                pass  # logging's own path reports it (Handler.handleError)
        logger = self.logger
        logger.handle(
            # makeRecord, not Logger.log: that would walk the stack for a caller that
            # the JSON line does not show.
            logger.makeRecord(
                ACCESS_LOGGER, level, "", 0, "request", (), None, extra={"fields": fields}
            )
        )

    def _plain_handler(self, level: int) -> JsonLineHandler | None:
        logger: logging.Logger | None = self.logger
        root = logging.getLogger()
        while logger is not None and logger is not root:
            if logger.handlers or logger.filters or not logger.propagate:
                return None
            logger = logger.parent
        if root.filters or len(root.handlers) != 1:
            return None
        handler = root.handlers[0]
        if type(handler) is not JsonLineHandler or level < handler.level:
            return None
        # The noise filter passes every line of the proxy's own loggers.
        if any(not isinstance(f, _DropNoise) for f in handler.filters):
            return None
        return handler


# Library lines that are noise for a proxy that only counts tokens: transformers
# without torch (the proxy never needs models), config keys of models it never runs.
_LIBRARY_NOISE = ("PyTorch was not found", "rope_parameters")


class _DropNoise(logging.Filter):
    """On the handlers: a filter on the ``transformers`` logger would not see the
    records of its children (``transformers.modeling_rope_utils``, ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("transformers"):
            return True  # the proxy's own lines, the access line: one check only
        message = record.getMessage()
        return not any(noise in message for noise in _LIBRARY_NOISE)


def adopt_transformers_logging() -> None:
    """Route transformers' logging through ours (JSON lines), minus its noise.

    Call it right before transformers is first imported (the ``hf:`` counter's
    loading): transformers gives its logger a plain-text stderr handler of its own at
    import, and logs its advisory "PyTorch was not found" then. Its handler is
    removed, and its records propagate to the root handlers (``setup_logging``'s),
    which drop the noise; the advisory is turned off before the import.
    """
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropNoise) for f in handler.filters):
            handler.addFilter(_DropNoise())
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()


def setup_logging(level: str) -> None:
    """Send every logger of the process (uvicorn's too) to stderr as JSON lines.

    Called by ``trimproxy serve`` and by each worker's app factory (workers are
    fresh interpreters and inherit no logging setup); calling it twice is harmless.
    """
    sys.stderr.flush()
    handler = JsonLineHandler(sys.stderr.fileno())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # Thread and process names are not in our lines; looking them up costs on every
    # record, the access line included.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # warnings.warn (libraries' deprecations and the like) as log records, so that
    # they are JSON lines too, not Python's plain "file:line: Warning" text.
    logging.captureWarnings(True)
    for name in ("uvicorn", "uvicorn.error"):
        # uvicorn's own dictConfig handlers would write plain text beside ours.
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    # trimproxy.access replaces uvicorn's access line (which also names the client's
    # address); uvicorn logs one only while this logger has handlers.
    uvicorn_access = logging.getLogger("uvicorn.access")
    uvicorn_access.handlers.clear()
    uvicorn_access.propagate = False
