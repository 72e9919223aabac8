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
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics, multiprocess_dir
from proxy.settings import Settings
from proxy.upstream import Upstream

log = logging.getLogger("trimproxy.scrape")

KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_WANTED = (*KV_NAMES, RUNNING, WAITING)
# vLLM's /metrics runs to hundreds of KB of histograms; only the lines of these four
# families are handed to the (pure-Python) parser, so a scrape costs the event loop
# a string scan rather than milliseconds of parsing.
_LINE_PREFIXES = tuple(
    p for n in _WANTED for p in (f"{n}{{", f"{n} ", f"# TYPE {n} ", f"# HELP {n} ")
)
_MAX_BODY = 16 << 20
_MAX_BACKOFF = 60.0


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
    kept = "\n".join(line for line in text.splitlines() if line.startswith(_LINE_PREFIXES))
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(kept + "\n"):
        for sample in family.samples:
            if sample.name in _WANTED and not math.isnan(sample.value):
                values.setdefault(sample.name, []).append(sample.value)
    kv = next((max(values[n]) for n in KV_NAMES if n in values), None)
    running = sum(values[RUNNING]) if RUNNING in values else None
    waiting = sum(values[WAITING]) if WAITING in values else None
    return UpstreamStats(kv, running, waiting)


class UpstreamScraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        metrics: Metrics,
        interval: float,
        *,
        headers: Mapping[str, str] | None = None,
        lock_path: str | None = None,
    ) -> None:
        self._session = session
        self._url = base_url + "/metrics"
        self._metrics = metrics
        self._interval = interval
        self._headers = {"accept-encoding": "identity", **(headers or {})}
        self._timeout = aiohttp.ClientTimeout(total=min(10.0, max(2.0, interval)))
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
        cap = max(_MAX_BACKOFF, self._interval)
        while True:
            if self._is_leader():
                try:
                    ok = await self.scrape_once()
                except Exception:  # a bug here must not end the scraping for good
                    log.exception("scraping %s failed unexpectedly", self._url)
                    ok = False
                # Back off while the upstream has nothing to give (FastChat, or down),
                # up to a minute, so a restarted vLLM is picked up again soon.
                delay = self._interval if ok else min(delay * 2, cap)
            else:
                delay = self._interval  # another worker scrapes; ask for the lock next tick
            await asyncio.sleep(delay)

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
            async with self._session.get(
                self._url, headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    state = "http_404" if resp.status == 404 else "http_error"
                    return self._fail(state, resp.status)
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > _MAX_BODY:
                        return self._fail("too_large", resp.status)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._fail(type(exc).__name__, None)
        try:
            stats = parse_stats(body.decode("utf-8", errors="replace"))
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
            else:
                log.warning(
                    "scraping %s failed (%s); retrying with back-off, logged again on change",
                    self._url,
                    status if status is not None else state,
                )
        return False


def build_scraper(
    settings: Settings, upstream: Upstream, metrics: Metrics
) -> UpstreamScraper | None:
    """The scraper the lifespan starts; None when ``TRIMPROXY_UPSTREAM_METRICS_INTERVAL=0``."""
    if settings.upstream_metrics_interval <= 0:
        return None
    directory = multiprocess_dir()
    headers: dict[str, str] = {}
    if settings.upstream_api_key:
        headers["authorization"] = f"Bearer {settings.upstream_api_key}"
    return UpstreamScraper(
        upstream.session,
        settings.upstream_url,
        metrics,
        settings.upstream_metrics_interval,
        headers=headers,
        lock_path=os.path.join(directory, "upstream-scraper.lock") if directory else None,
    )
