"""What one scrape of an engine's ``/metrics`` said (``proxy.scrape`` reads it; the
aggregate gauges and ``trimproxy top`` sum it over the engines)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    preemptions: float | None = None

    @property
    def prefix_hit_ratio(self) -> float | None:
        """Hits over queries since the engine started; None before its first query."""
        if self.prefix_hits is None or not self.prefix_queries:
            return None
        return self.prefix_hits / self.prefix_queries
