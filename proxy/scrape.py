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
import contextlib
import fcntl
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from proxy.admission.capacity import EngineCache, parse_cache_config
from proxy.metrics import Metrics, multiprocess_dir
from proxy.settings import Settings
from proxy.upstream import Upstream, UpstreamCallFailed
from proxy.vllm_metrics import KV_USAGE_NAMES, RUNNING, WAITING, line_prefixes, selected

log = logging.getLogger("trimproxy.scrape")

KV_NAMES = KV_USAGE_NAMES
_WANTED = (*KV_NAMES, RUNNING, WAITING)
# Only these four families reach the parser: a scrape costs the event loop a string
# scan rather than milliseconds of parsing (see proxy/vllm_metrics.py).
_LINE_PREFIXES = line_prefixes(_WANTED)
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


@dataclass(frozen=True, slots=True)
class UpstreamStats:
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None


def parse_stats(text: str) -> UpstreamStats:
    """The upstream's numbers, aggregated over its label sets (engines, models).

    KV usage is the maximum (the fullest engine is the one that preempts first);
    request counts are summed.
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(selected(text, _LINE_PREFIXES)):
        for sample in family.samples:
            if sample.name in _WANTED and not math.isnan(sample.value):
                values.setdefault(sample.name, []).append(sample.value)
    kv = next((max(values[n]) for n in KV_NAMES if n in values), None)
    running = sum(values[RUNNING]) if RUNNING in values else None
    waiting = sum(values[WAITING]) if WAITING in values else None
    return UpstreamStats(kv, running, waiting)


class UpstreamScraper:
    """Asks ``Upstream.metrics_text()`` (the key and timeouts are the upstream's) every
    ``interval`` seconds and sets the gauges."""

    def __init__(
        self,
        upstream: Upstream,
        metrics: Metrics,
        interval: float,
        *,
        lock_path: str | None = None,
        on_engine: EngineHook | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._upstream = upstream
        self._sleep = sleep
        self._on_engine = on_engine
        self._capacity_due = 0.0
        self._url = upstream.base_url + "/metrics"
        self._metrics = metrics
        self._interval = interval
        # One scrape ends before the next is due (and within the configured timeouts).
        self._budget = min(10.0, max(2.0, interval))
        self._lock_path = lock_path
        self._lock_fd: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._state = "starting"  # the last outcome, so each change is logged once

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="trimproxy-upstream-scraper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
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
            text = await self._upstream.metrics_text(max_bytes=_MAX_BODY, timeout=self._budget)
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
        m = self._metrics
        m.kv_cache_usage.set(stats.kv_cache_usage)
        if stats.running is not None:
            m.upstream_running.set(stats.running)
        if stats.waiting is not None:
            m.upstream_waiting.set(stats.waiting)
        m.upstream_metrics_up.set(1)
        if self._state != "ok":
            log.info("exporting the upstream's KV-cache usage from %s", self._url)
        self._state = "ok"
        return True

    async def _read_capacity(self) -> None:
        """The engine's KV capacity alone, for a worker that does not scrape."""
        assert self._on_engine is not None
        try:
            text = await self._upstream.metrics_text(max_bytes=_MAX_BODY, timeout=self._budget)
        except UpstreamCallFailed:
            self._on_engine(None)
            return  # asked again on the next tick
        cache = parse_cache_config(text)
        self._on_engine(cache)
        if cache is not None:
            self._capacity_due = time.monotonic() + max(_CAPACITY_EVERY, self._interval)

    def _fail(self, state: str, status: int | None) -> bool:
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
                    " or ".join(KV_NAMES),
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
    settings: Settings, upstream: Upstream, metrics: Metrics, on_engine: EngineHook | None = None
) -> UpstreamScraper | None:
    """The scraper the lifespan starts; None when ``TRIMPROXY_UPSTREAM_METRICS_INTERVAL=0``.

    ``on_engine`` gets the engine's KV-cache figures from every scrape (``auto`` admission).
    """
    if settings.upstream_metrics_interval <= 0:
        return None
    directory = multiprocess_dir()
    return UpstreamScraper(
        upstream,
        metrics,
        settings.upstream_metrics_interval,
        lock_path=os.path.join(directory, "upstream-scraper.lock") if directory else None,
        on_engine=on_engine,
    )
