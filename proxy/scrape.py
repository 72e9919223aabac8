"""Scrape the upstream's own ``/metrics`` and re-export its KV-cache numbers.

vLLM exports ``vllm:kv_cache_usage_perc`` (older releases: ``vllm:gpu_cache_usage_perc``;
both a 0..1 fraction despite the name), ``vllm:num_requests_running`` and
``vllm:num_requests_waiting``. A background task started in the lifespan copies
them into ``trimproxy_upstream_*`` gauges every ``TRIMPROXY_UPSTREAM_METRICS_INTERVAL``
seconds, so one Prometheus job shows prompt lengths and KV usage on one time axis.

FastChat serves no ``/metrics`` (404): that is said once, and the scraper backs off.
With several workers only the one holding a lock file in the multiprocess directory
scrapes; if it dies the kernel drops its lock and another worker takes over.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

from proxy.admission.capacity import EngineCache, parse_cache_config
from proxy.background import Background
from proxy.engines.engine import Engine
from proxy.engines.stats import EngineStats
from proxy.metrics import Metrics, multiprocess_dir
from proxy.settings import Settings
from proxy.upstream.calls import UpstreamCallFailed
from proxy.upstream.client import Upstream
from proxy.vllm_metrics import (
    KV_USAGE_NAMES,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    WAITING,
    engine_figures,
)

log = logging.getLogger("trimproxy.scrape")

_MAX_BODY = 16 << 20
_MAX_BACKOFF = 60.0
# A worker that does not scrape still reads the engine's KV capacity for its own
# admission ledger (``on_engine``), this often: the capacity changes only on restarts.
_CAPACITY_EVERY = 60.0

#: Called after each scrape with the engine's cache figures, None when it had none.
EngineHook = Callable[[EngineCache | None], None]
Sleep = Callable[[float], Awaitable[None]]


def next_delay(previous: float, ok: bool, interval: float) -> float:
    """Seconds until the next scrape: the interval after a good one; doubled after a
    failed one (FastChat has no /metrics, a vLLM may be restarting), up to a minute (or
    the interval, if longer), so a restarted engine is picked up again soon."""
    if ok:
        return interval
    return min(previous * 2, max(_MAX_BACKOFF, interval))


def parse_stats(text: str) -> EngineStats:
    """The upstream's numbers, aggregated over its label sets (engines, models):
    ``vllm_metrics.engine_figures``, KV usage the fullest engine's, counts summed."""
    kv, summed = engine_figures(text)
    return EngineStats(
        kv,
        summed.get(RUNNING),
        summed.get(WAITING),
        summed.get(PREFIX_HITS),
        summed.get(PREFIX_QUERIES),
        summed.get(PREEMPTIONS),
    )


class UpstreamScraper:
    """Asks one engine's ``/metrics`` (``Upstream.metrics_text``: the key and timeouts
    are the upstream's) every ``interval`` seconds and sets its ``engine`` gauges; with
    ``aggregate``, the unlabelled ``trimproxy_upstream_*`` gauges too, over every
    engine of the upstream (KV usage the fullest engine's, requests summed, up when
    every engine's last scrape was)."""

    def __init__(
        self,
        upstream: Upstream,
        metrics: Metrics,
        interval: float,
        *,
        lock_path: str | None = None,
        on_engine: EngineHook | None = None,
        sleep: Sleep = asyncio.sleep,
        engine: Engine | None = None,
        aggregate: bool = True,
    ) -> None:
        self._upstream = upstream
        self._engine = engine if engine is not None else upstream.engines.all()[0]
        self._aggregate = aggregate
        label = metrics.engine_label(self._engine.label)
        self._gauges = (
            metrics.engine_kv_usage.labels(label),
            metrics.engine_running.labels(label),
            metrics.engine_waiting.labels(label),
            metrics.engine_prefix_hit_ratio.labels(label),
            metrics.engine_preemptions.labels(label),
        )
        self._sleep = sleep
        self._on_engine = on_engine
        self._capacity_due = 0.0
        self._url = self._engine.url + "/metrics"
        self._metrics = metrics
        self._interval = interval
        # One scrape ends before the next is due (and within the configured timeouts).
        self._budget = min(10.0, max(2.0, interval))
        self._lock_path = lock_path
        self._lock_fd: int | None = None
        self._background = Background("trimproxy-upstream-scraper", self._run, log)
        self._state = "starting"  # the last outcome, so each change is logged once

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _run(self) -> None:
        delay = self._interval
        while True:
            if self._is_leader():
                try:
                    ok = await self.scrape_once()
                except Exception:  # a bug here must not end the scraping for good
                    log.exception("scraping %s failed unexpectedly", self._url)
                    ok = False
                delay = next_delay(delay, ok, self._interval)
            else:
                delay = self._interval  # another worker scrapes; ask for the lock next tick
                if self._on_engine is not None and time.monotonic() >= self._capacity_due:
                    await self._read_capacity()
            await self._sleep(delay)

    def _is_leader(self) -> bool:
        if self._lock_path is None or self._lock_fd is not None:
            return True
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return True  # no lock to be had: scrape uncoordinated ("mostrecent" copes)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        log.debug("this worker (pid %d) scrapes the upstream's /metrics", os.getpid())
        return True

    async def scrape_once(self) -> bool:
        """One scrape; True when the KV-cache usage was found and exported."""
        try:
            text = await self._upstream.metrics_text(
                max_bytes=_MAX_BODY, timeout=self._budget, engine=self._engine
            )
        except UpstreamCallFailed as exc:
            if self._on_engine is not None:
                self._on_engine(None)
            return self._fail(exc.reason, exc.status)
        if self._on_engine is not None:
            self._on_engine(parse_cache_config(text))
        try:
            stats = parse_stats(text)
        except ValueError:  # prometheus-client's parser on a malformed line
            return self._fail("unparsable", 200)
        if stats.kv_cache_usage is None:
            return self._fail("no_kv_metric", 200)
        self._engine.stats = stats
        kv, running, waiting, hit_ratio, preemptions = self._gauges
        kv.set(stats.kv_cache_usage)
        if stats.running is not None:
            running.set(stats.running)
        if stats.waiting is not None:
            waiting.set(stats.waiting)
        if stats.prefix_hit_ratio is not None:
            hit_ratio.set(stats.prefix_hit_ratio)
        if stats.preemptions is not None:
            preemptions.set(stats.preemptions)
        self._export_aggregate()
        if self._state != "ok":
            log.info("exporting the upstream's KV-cache usage from %s", self._url)
        self._state = "ok"
        return True

    async def _read_capacity(self) -> None:
        """The engine's KV capacity alone, for a worker that does not scrape."""
        assert self._on_engine is not None
        try:
            text = await self._upstream.metrics_text(
                max_bytes=_MAX_BODY, timeout=self._budget, engine=self._engine
            )
        except UpstreamCallFailed:
            self._on_engine(None)
            return  # asked again on the next tick
        cache = parse_cache_config(text)
        self._on_engine(cache)
        if cache is not None:
            self._capacity_due = time.monotonic() + max(_CAPACITY_EVERY, self._interval)

    def _export_aggregate(self) -> None:
        """The unlabelled gauges over the engines' last good scrapes."""
        if not self._aggregate:
            return
        engines = self._upstream.engines.all()
        found = [e.stats for e in engines if e.stats is not None]
        m = self._metrics
        m.upstream_metrics_up.set(1 if len(found) == len(engines) else 0)
        if not found:
            return
        m.kv_cache_usage.set(max(s.kv_cache_usage or 0.0 for s in found))
        running = [s.running for s in found if s.running is not None]
        if running:
            m.upstream_running.set(sum(running))
        waiting = [s.waiting for s in found if s.waiting is not None]
        if waiting:
            m.upstream_waiting.set(sum(waiting))

    def _fail(self, state: str, status: int | None) -> bool:
        self._engine.stats = None
        if self._aggregate:
            self._metrics.upstream_metrics_up.set(0)
        if state != self._state:
            self._state = state
            if state == "http_404":
                log.info(
                    "the upstream has no %s (404; FastChat serves none): "
                    "trimproxy_upstream_* gauges stay unset; retrying quietly",
                    self._url,
                )
            elif state == "no_kv_metric":
                log.warning(
                    "%s has no %s; trimproxy_upstream_kv_cache_usage_ratio stays unset",
                    self._url,
                    " or ".join(KV_USAGE_NAMES),
                )
            elif status in (401, 403):
                log.warning(
                    "scraping %s answered HTTP %s: set TRIMPROXY_UPSTREAM_API_KEY to the key "
                    "the upstream expects; retrying with back-off",
                    self._url,
                    status,
                )
            else:
                log.warning(
                    "scraping %s failed (%s); retrying with back-off, logged again on change",
                    self._url,
                    status if status is not None else state,
                )
        return False


def build_scraper(
    settings: Settings,
    upstream: Upstream,
    metrics: Metrics,
    on_engine: EngineHook | None = None,
    *,
    engine: Engine | None = None,
    aggregate: bool = True,
    sleep: Sleep = asyncio.sleep,
) -> UpstreamScraper | None:
    """The scraper of one engine (the upstream's first by default) that the lifespan
    starts; None when ``TRIMPROXY_UPSTREAM_METRICS_INTERVAL=0``.

    ``on_engine`` gets the engine's KV-cache figures from every scrape (``auto`` admission);
    ``sleep`` is what the loop waits between scrapes with (a test steps it).
    """
    if settings.upstream_metrics_interval <= 0:
        return None
    engine = engine if engine is not None else upstream.engines.all()[0]
    directory = multiprocess_dir()
    # One lock per engine: with several workers, one of them scrapes each engine.
    name = hashlib.sha256(engine.url.encode()).hexdigest()[:12]
    return UpstreamScraper(
        upstream,
        metrics,
        settings.upstream_metrics_interval,
        lock_path=os.path.join(directory, f"upstream-scraper-{name}.lock") if directory else None,
        on_engine=on_engine,
        sleep=sleep,
        engine=engine,
        aggregate=aggregate,
    )
