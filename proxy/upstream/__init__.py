"""Talking to the upstream model server: ``Upstream`` (the client: engines, their
order, failover, the engine's API), ``Transport`` (the one aiohttp session), and the
context windows learned from it (docs/architecture.md §12)."""

from proxy.upstream.calls import (
    Readiness,
    Tokenized,
    UpstreamCallFailed,
    connection_failed,
    dropped,
    invalid_head,
    parse_models,
    unanswered,
)
from proxy.upstream.client import Upstream
from proxy.upstream.transport import IDLE_KEEPALIVE, ErrorHook, Transport
from proxy.upstream.windows import ContextWindows

__all__ = [
    "IDLE_KEEPALIVE",
    "ContextWindows",
    "ErrorHook",
    "Readiness",
    "Tokenized",
    "Transport",
    "Upstream",
    "UpstreamCallFailed",
    "connection_failed",
    "dropped",
    "invalid_head",
    "parse_models",
    "unanswered",
]
