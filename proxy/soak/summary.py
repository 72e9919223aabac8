"""The numbers of a soak: per arm, from its request records and engine samples.

Pure functions, no I/O. Percentiles interpolate linearly between the two nearest
ranks (numpy's default). Prompt sizes are the *forwarded* ones (what the engine had to
hold), latencies those of requests that succeeded: a refusal's few milliseconds would
only flatter the arm that fails most. Engine counters (preemptions, prefix-cache hits
and queries) are taken as their increase over the arm, so an engine that ran before
the soak, or the other arm, adds nothing; a counter that drops (the engine restarted)
counts its new value as increase. A figure the engine does not report is ``None``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.soak.records import RequestRecord, Sample

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
    hits = counter_increase(s.prefix_cache_hits_total for s in samples)
    queries = counter_increase(s.prefix_cache_queries_total for s in samples)
    completion = sum(r.completion_tokens or 0 for r in ok)
    by_status = Counter(r.error_key or "unknown" for r in failed)
    preemptions = counter_increase(s.preemptions_total for s in samples)
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
        "prefix_cache_hit_ratio": _round(hits / queries, 4)
        if hits is not None and queries
        else None,
        "wall_seconds": round(wall_seconds, 3),
        "completion_tokens_per_second": (
            round(completion / wall_seconds, 2) if wall_seconds > 0 else None
        ),
        "latency_p50_seconds": _round(percentile(latencies, 0.5), 4),
        "latency_p99_seconds": _round(percentile(latencies, 0.99), 4),
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
