"""The numbers of a soak: per arm, from its request records and engine samples.

Pure functions, no I/O. Percentiles interpolate linearly between the two nearest
ranks (numpy's default). Prompt sizes are the *forwarded* ones (what the engine had to
hold), latencies those of requests that succeeded: a refusal's few milliseconds would
only flatter the arm that fails most. Engine counters (preemptions, prefix-cache hits
and queries) are taken as their increase over the arm, so an engine that ran before
the soak, or the other arm, adds nothing; a counter that drops (the engine restarted)
counts its new value as increase. A figure the engine does not report is ``None``.

Several engines: each engine's counters are taken per engine and then summed, so the
prefix-cache hit ratio is the cluster's (the sum over the engines of their hits'
increase over the sum of their queries'), and a scrape that failed on one engine for
a sample never reads as a counter reset. ``engines`` holds each engine's own figures.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.soak.records import EngineFigures, RequestRecord, Sample

SUMMARY_FIELDS = (
    "requests",
    "errors",
    "errors_by_status",
    "prompt_tokens_p50",
    "prompt_tokens_max",
    "kv_usage_peak",
    "kv_usage_mean",
    "preemptions",
    "waiting_peak",
    "prefix_cache_hit_ratio",
    "wall_seconds",
    "completion_tokens_per_second",
    "latency_p50_seconds",
    "latency_p99_seconds",
    "engines",
)

#: The one-line figures, as the tables show them (``engines`` gets its own table).
SCALAR_FIELDS = SUMMARY_FIELDS[:-1]

ENGINE_SUMMARY_FIELDS = (
    "kv_usage_peak",
    "kv_usage_mean",
    "running_peak",
    "waiting_peak",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "prefix_cache_hit_ratio",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) with linear interpolation; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def counter_increase(values: Iterable[float | None]) -> float | None:
    """How much a counter grew over the samples; ``None`` when never reported."""
    seen = [v for v in values if v is not None]
    if not seen:
        return None
    total = 0.0
    for before, after in itertools.pairwise(seen):
        total += after - before if after >= before else after
    return total


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(hits: float | None, queries: float | None) -> float | None:
    return _round(hits / queries, 4) if hits is not None and queries else None


def _peak(values: Iterable[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return max(seen) if seen else None


def engine_summary(series: Sequence[EngineFigures]) -> dict[str, Any]:
    """One engine's figures over an arm, from its entries in the samples."""
    ok = [f for f in series if "error" not in f]
    kv = [f["kv_usage"] for f in ok if f.get("kv_usage") is not None]
    running, waiting = _peak(f.get("running") for f in ok), _peak(f.get("waiting") for f in ok)
    preemptions = counter_increase(f.get("preemptions_total") for f in ok)
    hits = counter_increase(f.get("prefix_cache_hits_total") for f in ok)
    queries = counter_increase(f.get("prefix_cache_queries_total") for f in ok)
    return {
        "kv_usage_peak": _round(max(kv), 4) if kv else None,
        "kv_usage_mean": _round(sum(kv) / len(kv), 4) if kv else None,
        "running_peak": None if running is None else int(running),
        "waiting_peak": None if waiting is None else int(waiting),
        "preemptions": None if preemptions is None else int(preemptions),
        "prefix_cache_hits": None if hits is None else int(hits),
        "prefix_cache_queries": None if queries is None else int(queries),
        "prefix_cache_hit_ratio": _ratio(hits, queries),
    }


def engines_summary(samples: Sequence[Sample]) -> dict[str, dict[str, Any]]:
    """Each engine that any sample names, in the order they were first seen."""
    series: dict[str, list[EngineFigures]] = {}
    for s in samples:
        for name, entry in (s.engines or {}).items():
            series.setdefault(name, []).append(entry)
    return {name: engine_summary(entries) for name, entries in series.items()}


def _summed(engines: dict[str, dict[str, Any]], field: str) -> float | None:
    values = [e[field] for e in engines.values() if e[field] is not None]
    return float(sum(values)) if values else None


def arm_summary(
    records: Sequence[RequestRecord], samples: Sequence[Sample], wall_seconds: float
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    prompts = [
        float(r.forwarded_prompt_tokens) for r in ok if r.forwarded_prompt_tokens is not None
    ]
    latencies = [r.latency_seconds for r in ok]
    kv = [s.kv_usage for s in samples if s.kv_usage is not None]
    waiting = [s.waiting for s in samples if s.waiting is not None]
    engines = engines_summary(samples)
    if engines:
        hits, queries = (
            _summed(engines, "prefix_cache_hits"),
            _summed(engines, "prefix_cache_queries"),
        )
        preemptions = _summed(engines, "preemptions")
    else:  # samples written before engines were sampled one by one
        hits = counter_increase(s.prefix_cache_hits_total for s in samples)
        queries = counter_increase(s.prefix_cache_queries_total for s in samples)
        preemptions = counter_increase(s.preemptions_total for s in samples)
    completion = sum(r.completion_tokens or 0 for r in ok)
    by_status = Counter(r.error_key or "unknown" for r in failed)
    return {
        "requests": len(records),
        "errors": len(failed),
        "errors_by_status": dict(sorted(by_status.items())),
        "prompt_tokens_p50": percentile(prompts, 0.5),
        "prompt_tokens_max": int(max(prompts)) if prompts else None,
        "kv_usage_peak": _round(max(kv), 4) if kv else None,
        "kv_usage_mean": _round(sum(kv) / len(kv), 4) if kv else None,
        "preemptions": None if preemptions is None else int(preemptions),
        "waiting_peak": int(max(waiting)) if waiting else None,
        "prefix_cache_hit_ratio": _ratio(hits, queries),
        "wall_seconds": round(wall_seconds, 3),
        "completion_tokens_per_second": (
            round(completion / wall_seconds, 2) if wall_seconds > 0 else None
        ),
        "latency_p50_seconds": _round(percentile(latencies, 0.5), 4),
        "latency_p99_seconds": _round(percentile(latencies, 0.99), 4),
        "engines": engines,
    }


def verdict(summary: dict[str, Any], max_kv_usage: float | None) -> list[str]:
    """Why the run fails its gate (empty: exit 0). Only the target arm is judged:
    ``--compare`` is there to show what happens without the proxy."""
    target = summary["target"]
    reasons = []
    if target["errors"]:
        reasons.append(f"the target arm had {target['errors']} failed requests")
    if max_kv_usage is not None:
        peak = target["kv_usage_peak"]
        if peak is None:
            reasons.append("--max-kv-usage was given but the engine reported no KV usage")
        elif peak > max_kv_usage:
            reasons.append(f"the target arm's KV usage peaked at {peak:.3f} > {max_kv_usage:g}")
    return reasons
