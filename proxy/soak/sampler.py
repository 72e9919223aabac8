"""The engine, sampled every half second: its own ``/metrics`` and the GPUs' memory.

Only the lines of the few families a soak needs are handed to prometheus-client's
text parser: vLLM's page runs to hundreds of kilobytes of histograms, and parsing it
all twice a second would load the very machine being measured. Across the ranks of
one engine (data parallel) KV usage is the fullest one's, counts are summed.

Several engines (the proxy routes over a list) are scraped at once, each on its own
page; a sample keeps each engine's figures under its ``host:port`` and, at the top,
the same fold as for data-parallel ranks, so that a one-engine report reads as before.

GPU memory comes from ``nvidia-smi`` where the machine has one; elsewhere the sample
has no such field.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from proxy.soak.options import SAMPLE_INTERVAL
from proxy.soak.records import EngineFigures, Sample
from proxy.vllm_metrics import (
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    WAITING,
    cache_config_labels,
    engine_figures,
)

_NVIDIA_SMI = ("--query-gpu=memory.used", "--format=csv,noheader,nounits")


@dataclass(frozen=True, slots=True)
class EngineReading:
    kv_usage: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    cache_config: dict[str, str] | None = None
    """The labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks, …)."""

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_engine_metrics(text: str) -> EngineReading:
    kv, values = engine_figures(text)
    engines = cache_config_labels(text)
    return EngineReading(kv, values, engines[0] if engines else None)


def parse_nvidia_smi(output: str) -> list[float] | None:
    """MiB used per card from ``--format=csv,noheader,nounits``, or ``None``."""
    cards: list[float] = []
    for line in output.splitlines():
        if line.strip():
            try:
                cards.append(float(line.strip()))
            except ValueError:
                return None
    return cards or None


async def gpu_memory_used(executable: str) -> list[float] | None:
    try:
        child = await asyncio.create_subprocess_exec(
            executable,
            *_NVIDIA_SMI,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(child.communicate(), timeout=5.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        return None
    return parse_nvidia_smi(out.decode()) if child.returncode == 0 else None


def engine_name(metrics_url: str) -> str:
    """``host:port`` of an engine's metrics page: the proxy's ``engine`` label."""
    parts = urlsplit(metrics_url)
    return parts.netloc or metrics_url


def figures(reading: EngineReading) -> EngineFigures:
    return {
        "kv_usage": reading.kv_usage,
        "running": reading.get(RUNNING),
        "waiting": reading.get(WAITING),
        "preemptions_total": reading.get(PREEMPTIONS),
        "prefix_cache_hits_total": reading.get(PREFIX_HITS),
        "prefix_cache_queries_total": reading.get(PREFIX_QUERIES),
    }


def _fold(readings: Sequence[EngineReading]) -> EngineReading:
    """Several engines as one: the fullest KV cache, the counts summed."""
    kv = [r.kv_usage for r in readings if r.kv_usage is not None]
    values: dict[str, float] = {}
    for reading in readings:
        for name, value in reading.values.items():
            values[name] = values.get(name, 0.0) + value
    return EngineReading(max(kv) if kv else None, values, readings[0].cache_config)


_SCRAPE_ERRORS = (TimeoutError, aiohttp.ClientError, OSError, ValueError)


class EngineSampler:
    """Samples one arm's engines every ``SAMPLE_INTERVAL`` seconds while it runs."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        metrics_urls: Sequence[str],
        headers: dict[str, str],
        on_sample: Callable[[Sample], None],
    ) -> None:
        self.session = session
        self.metrics_urls = list(metrics_urls)
        self.headers = headers
        self.on_sample = on_sample
        self.nvidia_smi = shutil.which("nvidia-smi")
        self.last_reading: EngineReading | None = None

    async def read_one(self, url: str) -> EngineReading:
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with self.session.get(url, headers=self.headers, timeout=timeout) as response:
            response.raise_for_status()
            return parse_engine_metrics(await response.text())

    async def read_all(self) -> dict[str, EngineReading | BaseException]:
        """Every engine's page, scraped at once; a failed scrape is its exception."""
        if not self.metrics_urls:
            raise ValueError("engine metrics are off (--metrics-url none)")
        got = await asyncio.gather(
            *(self.read_one(url) for url in self.metrics_urls), return_exceptions=True
        )
        out: dict[str, EngineReading | BaseException] = {}
        for url, result in zip(self.metrics_urls, got, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, _SCRAPE_ERRORS):
                raise result
            out[engine_name(url)] = result
        return out

    async def read(self) -> EngineReading:
        """All engines folded into one reading; raises when none answered."""
        readings = await self.read_all()
        answered = [r for r in readings.values() if isinstance(r, EngineReading)]
        if not answered:
            raise next(e for e in readings.values() if isinstance(e, BaseException))
        return _fold(answered)

    async def sample(self, arm: str, started: float) -> Sample:
        t, unix = time.monotonic() - started, time.time()
        gpu_task = (
            asyncio.ensure_future(gpu_memory_used(self.nvidia_smi)) if self.nvidia_smi else None
        )
        if not self.metrics_urls:  # --metrics-url none: GPU memory alone
            gpu = await gpu_task if gpu_task is not None else None
            return Sample(arm, round(t, 4), unix, gpu_memory_used_mib=gpu)
        try:
            readings = await self.read_all()
        except _SCRAPE_ERRORS as exc:
            gpu = await gpu_task if gpu_task is not None else None
            return Sample(arm, round(t, 4), unix, gpu_memory_used_mib=gpu, error=str(exc)[:200])
        gpu = await gpu_task if gpu_task is not None else None
        answered = [r for r in readings.values() if isinstance(r, EngineReading)]
        engines: dict[str, EngineFigures] = {
            name: figures(r) if isinstance(r, EngineReading) else {"error": str(r)[:200]}
            for name, r in readings.items()
        }
        failed = [f"{name}: {f['error']}" for name, f in engines.items() if "error" in f]
        error = "; ".join(failed)[:400] if failed else None
        if not answered:
            return Sample(
                arm, round(t, 4), unix, gpu_memory_used_mib=gpu, error=error, engines=engines
            )
        reading = _fold(answered)
        self.last_reading = reading
        return Sample(
            arm,
            round(t, 4),
            unix,
            kv_usage=reading.kv_usage,
            running=reading.get(RUNNING),
            waiting=reading.get(WAITING),
            preemptions_total=reading.get(PREEMPTIONS),
            prefix_cache_hits_total=reading.get(PREFIX_HITS),
            prefix_cache_queries_total=reading.get(PREFIX_QUERIES),
            gpu_memory_used_mib=gpu,
            error=error,
            engines=engines,
        )

    async def run(self, arm: str, started: float, stop: asyncio.Event) -> None:
        """Sample on a fixed schedule until ``stop`` is set, then once more."""
        tick = 0
        while True:
            self.on_sample(await self.sample(arm, started))
            if stop.is_set():
                return
            tick += 1
            # A fixed grid: a slow scrape delays one sample, not all the later ones.
            delay = started + tick * SAMPLE_INTERVAL - time.monotonic()
            if delay < 0:
                tick = math.ceil((time.monotonic() - started) / SAMPLE_INTERVAL)
                delay = started + tick * SAMPLE_INTERVAL - time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, delay))
