"""Every metric the proxy exports, declared in one place (DESIGN section 6).

Metrics live on a ``Metrics`` object built by the app factory, each on the
registry it is given, so several apps (tests, workers) never collide. With more
than one worker, prometheus-client's multiprocess mode writes the values to
``PROMETHEUS_MULTIPROCESS_DIR`` and ``render`` aggregates them.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as mp

# Prompt lengths from a few dozen tokens up to long-context models.
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
# Chat answers take from milliseconds to many minutes.
SECONDS_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
)
ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -4, -1, 0, 1, 4, 16, 64, 256, 1024, 4096)

KNOWN_ROUTES = frozenset(
    (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/healthz",
        "/readyz",
        "/metrics",
    )
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def route_label(path: str) -> str:
    """Bounded ``route`` label: the known paths by name, everything else ``other``."""
    return path if path in KNOWN_ROUTES else "other"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "trimproxy_requests",
            "Requests answered, by route and HTTP status code.",
            ["route", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "trimproxy_request_duration_seconds",
            "Time from request start to the last byte of the answer.",
            ["route"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.upstream_ttfb = Histogram(
            "trimproxy_upstream_ttfb_seconds",
            "Time from forwarding to the upstream's first body byte.",
            ["route"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Histogram(
            "trimproxy_prompt_tokens",
            "Prompt tokens of chat requests as received and as forwarded.",
            ["stage"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.trimmed_messages = Counter(
            "trimproxy_trimmed_messages", "Messages dropped by trimming.", registry=r
        )
        self.trimmed_tokens = Counter(
            "trimproxy_trimmed_tokens", "Prompt tokens dropped by trimming.", registry=r
        )
        self.trim_events = Counter(
            "trimproxy_trim_events",
            "Requests whose history was trimmed, by reason.",
            ["reason"],
            registry=r,
        )
        self.session_limits = Counter(
            "trimproxy_session_limit",
            "Session limits hit, by reason and action.",
            ["reason", "action"],
            registry=r,
        )
        self.in_flight = Gauge(
            "trimproxy_requests_in_flight",
            "Requests being served now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.upstream_errors = Counter(
            "trimproxy_upstream_errors",
            "Failures talking to the upstream, by kind.",
            ["kind"],
            registry=r,
        )
        self.estimate_error = Histogram(
            "trimproxy_token_estimate_error_tokens",
            "Counted prompt tokens minus the upstream's usage.prompt_tokens.",
            buckets=ERROR_BUCKETS,
            registry=r,
        )
        self.kv_cache_usage = Gauge(
            "trimproxy_upstream_kv_cache_usage_ratio",
            "The upstream's KV-cache usage (0..1), scraped from its /metrics.",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.sessions_held = Gauge(
            "trimproxy_sessions",
            "Sessions held by this process's in-memory store.",
            registry=r,
            multiprocess_mode="livesum",
        )

    def render(self) -> bytes:
        directory = multiprocess_dir()
        if directory:
            registry = CollectorRegistry()
            mp.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
