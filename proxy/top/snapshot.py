"""One reading of a proxy's ``/metrics``, and what changed between two readings.

``read`` turns the Prometheus text into a ``Snapshot``: the gauges as they are, the
counters and histograms as totals. ``Window`` is the difference of two snapshots: rates
per second, and the recent prompt lengths (p50 and max of what the histograms counted
between the two readings, to the bucket: a histogram holds no exact values).

The proxy's ``/metrics`` is already the sum over its worker processes, so one reading
covers them all. Per-engine figures come from the ``engine``-labelled series
(``trimproxy_engine_*``) when the proxy has several engines, else from the unlabelled
``trimproxy_upstream_*`` and ``trimproxy_kv_*`` ones (docs/architecture.md §15). The
prompt, trim, session and admission figures are also kept per ``endpoint`` label (the
API a prompt came in by: chat, responses, messages, completions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: The label of the one engine of a proxy without ``engine``-labelled series.
UPSTREAM = "upstream"

#: The proxy's own routes: ``top``'s own reading of ``/metrics`` (and any other
#: scrape or probe) is no client traffic, and counting it showed an idle proxy at one
#: request a second. The rates and errors shown are those of the API routes.
OWN_ROUTES = frozenset(("/metrics", "/healthz", "/readyz"))

# Per-engine gauges: (the engine-labelled name, the unlabelled one for a single upstream).
_ENGINE_GAUGES = {
    "kv_usage": (
        "trimproxy_engine_kv_cache_usage_ratio",
        "trimproxy_upstream_kv_cache_usage_ratio",
    ),
    "running": ("trimproxy_engine_requests_running", "trimproxy_upstream_requests_running"),
    "waiting": ("trimproxy_engine_requests_waiting", "trimproxy_upstream_requests_waiting"),
    "reserved": ("trimproxy_engine_kv_reserved_tokens", "trimproxy_kv_reserved_tokens"),
    "capacity": ("trimproxy_engine_kv_capacity_tokens", "trimproxy_kv_capacity_tokens"),
    "up": ("trimproxy_engine_up", "trimproxy_upstream_metrics_up"),
    "hit_ratio": ("trimproxy_engine_prefix_cache_hit_ratio", ""),
    "preemptions": ("trimproxy_engine_preemptions", ""),
    "requests": ("trimproxy_engine_requests_total", ""),
}


@dataclass(slots=True)
class EngineRow:
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    reserved: float | None = None
    capacity: float | None = None
    up: float | None = None
    hit_ratio: float | None = None
    preemptions: float | None = None
    requests: float | None = None


@dataclass(slots=True)
class Histogram:
    """Cumulative bucket counts by upper bound (``+Inf`` last), and the count."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0

    def minus(self, before: Histogram) -> Histogram:
        return Histogram(
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.count - before.count,
        )

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket that holds the ``q`` quantile; None if empty."""
        if self.count <= 0:
            return None
        rank = q * self.count
        for le in sorted(self.buckets):
            if self.buckets[le] >= rank:
                return le
        return math.inf

    def top(self) -> float | None:
        """The upper bound of the highest bucket that holds anything (the max, to the
        bucket); None if empty."""
        if self.count <= 0:
            return None
        below = 0.0
        highest = None
        for le in sorted(self.buckets):
            if self.buckets[le] > below:
                highest = le
            below = self.buckets[le]
        return highest


#: The endpoint row of a proxy whose series carry no ``endpoint`` label (an older one).
NO_ENDPOINT = "-"


@dataclass(slots=True)
class EndpointRow:
    """One endpoint's prompts, trims, session resets and admission rejections: totals
    in a ``Snapshot``; in a ``Window``, the window's prompts and per-second rates."""

    prompt: dict[str, Histogram] = field(default_factory=dict)
    """``trimproxy_prompt_tokens`` by stage (``received``, ``forwarded``), all models."""
    trims: float = 0.0
    session_resets: float = 0.0
    admission_rejected: float = 0.0

    def since(self, before: EndpointRow, seconds: float) -> EndpointRow:
        """What happened after ``before``: its prompts, and rates over ``seconds`` (the
        totals themselves when there is no earlier reading: ``seconds`` 0)."""
        if not seconds:
            return self
        empty = Histogram()
        return EndpointRow(
            {s: h.minus(before.prompt.get(s, empty)) for s, h in self.prompt.items()},
            (self.trims - before.trims) / seconds,
            (self.session_resets - before.session_resets) / seconds,
            (self.admission_rejected - before.admission_rejected) / seconds,
        )


@dataclass(slots=True)
class Snapshot:
    at: float
    """When it was read (seconds, monotonic)."""
    engines: dict[str, EngineRow] = field(default_factory=dict)
    requests_by_code: dict[str, float] = field(default_factory=dict)
    """``trimproxy_requests_total`` summed over the API routes (not ``OWN_ROUTES``), by
    status code."""
    upstream_errors: dict[str, float] = field(default_factory=dict)
    trims: float = 0.0
    session_resets: float = 0.0
    in_flight: float = 0.0
    overruns: float = 0.0
    admission_rejected: float = 0.0
    prompt: dict[str, Histogram] = field(default_factory=dict)
    """``trimproxy_prompt_tokens`` by stage (``received``, ``forwarded``), all models."""
    endpoints: dict[str, EndpointRow] = field(default_factory=dict)
    """The prompt, trim, session and admission figures by ``endpoint`` label."""

    def endpoint(self, labels: Mapping[str, str]) -> EndpointRow:
        name = labels.get("endpoint", NO_ENDPOINT)
        row = self.endpoints.get(name)
        if row is None:
            row = self.endpoints[name] = EndpointRow()
        return row


def read(text: str, at: float) -> Snapshot:
    """The snapshot that ``/metrics`` text ``text``, read at ``at``, describes."""
    snap = Snapshot(at)
    labelled: dict[str, str] = {v[0]: k for k, v in _ENGINE_GAUGES.items()}
    plain: dict[str, str] = {v[1]: k for k, v in _ENGINE_GAUGES.items() if v[1]}
    single = EngineRow()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name in labelled and "engine" in labels:
                row = snap.engines.setdefault(labels["engine"], EngineRow())
                setattr(row, labelled[name], _add(getattr(row, labelled[name]), value))
            elif name in plain and "engine" not in labels:
                setattr(single, plain[name], _add(getattr(single, plain[name]), value))
            else:
                _count(snap, name, labels, value)
    if not snap.engines:
        snap.engines[UPSTREAM] = single
    return snap


def _add(old: float | None, value: float) -> float:
    return value if old is None else old + value


def _count(snap: Snapshot, name: str, labels: Mapping[str, str], value: float) -> None:
    if name == "trimproxy_requests_total":
        if labels.get("route") in OWN_ROUTES:
            return
        code = labels.get("code", "")
        snap.requests_by_code[code] = snap.requests_by_code.get(code, 0.0) + value
    elif name == "trimproxy_upstream_errors_total":
        kind = labels.get("kind", "")
        snap.upstream_errors[kind] = snap.upstream_errors.get(kind, 0.0) + value
    elif name == "trimproxy_trim_events_total":
        snap.trims += value
        snap.endpoint(labels).trims += value
    elif name == "trimproxy_session_limit_total" and labels.get("action") == "reset":
        snap.session_resets += value
        snap.endpoint(labels).session_resets += value
    elif name == "trimproxy_requests_in_flight":
        snap.in_flight += value
    elif name == "trimproxy_admission_overrun_total":
        snap.overruns += value
    elif name == "trimproxy_admission_rejected_total":
        snap.admission_rejected += value
        snap.endpoint(labels).admission_rejected += value
    elif name.startswith("trimproxy_prompt_tokens_"):
        stage = labels.get("stage", "")
        _histogram(snap.prompt, stage, name, labels, value)
        _histogram(snap.endpoint(labels).prompt, stage, name, labels, value)


def _histogram(
    into: dict[str, Histogram], stage: str, name: str, labels: Mapping[str, str], value: float
) -> None:
    hist = into.get(stage)
    if hist is None:
        hist = into[stage] = Histogram()
    if name.endswith("_bucket"):
        le = float(labels["le"])
        hist.buckets[le] = hist.buckets.get(le, 0.0) + value
    elif name.endswith("_count"):
        hist.count += value


@dataclass(slots=True)
class Window:
    """What happened between two snapshots (``before`` may be None: the first)."""

    now: Snapshot
    seconds: float
    requests: dict[str, float]
    """Requests per second by status code."""
    trims: float
    session_resets: float
    errors: dict[str, float]
    """Per second: answers with status >= 400 by code, and upstream failures by kind."""
    prompt: dict[str, Histogram]
    """The prompt lengths counted in the window, by stage."""
    endpoints: dict[str, EndpointRow]
    """Per endpoint: the window's prompt lengths, and rates (totals at the first reading)."""


def window(before: Snapshot | None, now: Snapshot) -> Window:
    if before is None:
        empty = Snapshot(now.at)
        return _window(empty, now, 0.0)
    return _window(before, now, max(now.at - before.at, 1e-9))


def _window(before: Snapshot, now: Snapshot, seconds: float) -> Window:
    def rate(a: float, b: float) -> float:
        return (b - a) / seconds if seconds else 0.0

    def rates(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
        return {k: rate(a.get(k, 0.0), v) for k, v in sorted(b.items())}

    errors = {
        c: r
        for c, r in rates(before.requests_by_code, now.requests_by_code).items()
        if c[:1] in "45"
    }
    errors.update(
        {f"upstream {k}": r for k, r in rates(before.upstream_errors, now.upstream_errors).items()}
    )
    prompt = {s: h.minus(before.prompt.get(s, Histogram())) for s, h in now.prompt.items()}
    endpoints = {
        name: row.since(before.endpoints.get(name, EndpointRow()), seconds)
        for name, row in now.endpoints.items()
    }
    return Window(
        now,
        seconds,
        rates(before.requests_by_code, now.requests_by_code),
        rate(before.trims, now.trims),
        rate(before.session_resets, now.session_resets),
        errors,
        prompt,
        endpoints,
    )
