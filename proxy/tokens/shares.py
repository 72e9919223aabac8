"""Dividing an exact total among messages when only estimates of the parts exist.

Shared by the counters that learn only a total (hf on templates it cannot attribute,
the vLLM ``/tokenize`` counter)."""

from __future__ import annotations

from collections.abc import Sequence


def scale_to(weights: Sequence[int], total: int) -> list[int]:
    """Integers proportional to ``weights`` that sum to ``total`` (largest remainder)."""
    if total <= 0 or not weights:
        return [0] * len(weights)
    mass = sum(max(w, 0) for w in weights)
    if mass == 0:
        weights, mass = [1] * len(weights), len(weights)
    shares = [max(w, 0) * total / mass for w in weights]
    out = [int(s) for s in shares]
    order = sorted(range(len(out)), key=lambda i: out[i] - shares[i])
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def fit_counts(per_message: Sequence[int], total: int) -> tuple[tuple[int, ...], int]:
    """(per_message, overhead) with ``sum + overhead == total`` and nothing negative:
    the estimates stand when they fit under the total, else they are scaled down."""
    parts = [max(n, 0) for n in per_message]
    if sum(parts) <= total:
        return tuple(parts), total - sum(parts)
    return tuple(scale_to(parts, total)), 0
