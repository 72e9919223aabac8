"""One soak run: check the setup, run the arms one after the other, write the files.

Each arm starts on an idle engine (nothing running or waiting, so the previous arm's
last answers do not count against this one), with the sampler's first sample taken
before the first request: counters are measured from there.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import aiohttp
import orjson

from proxy.soak.discovery import (
    SetupError,
    engine_info,
    first_reading,
    metrics_urls,
    model_window,
)
from proxy.soak.driver import ArmDriver
from proxy.soak.options import SAMPLE_INTERVAL, Arm, SoakOptions
from proxy.soak.records import RequestRecord, Sample
from proxy.soak.sampler import EngineReading, EngineSampler
from proxy.soak.summary import arm_summary, verdict
from proxy.vllm_metrics import RUNNING, WAITING

#: Longest wait for the engine to drain between arms, seconds.
IDLE_TIMEOUT = 120.0


class Listener(Protocol):
    """What the terminal display (``progress.SoakProgress``) hears about."""

    def start_arm(self, arm: Arm) -> None: ...

    def on_record(self, record: RequestRecord) -> None: ...

    def on_sample(self, sample: Sample) -> None: ...

    def finish_arm(self) -> None: ...


@dataclass
class SoakResult:
    summary: dict[str, Any]
    reasons: list[str]
    run: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def _line_writer(handle: IO[bytes], into: list[Any]) -> Callable[[Any], None]:
    def write(item: RequestRecord | Sample) -> None:
        into.append(item)
        handle.write(item.to_json() + b"\n")
        handle.flush()  # a run stopped with Ctrl-C keeps what it measured

    return write


async def _wait_idle(sampler: EngineSampler) -> None:
    """Until no engine runs or queues anything (their counts are summed)."""
    deadline = time.monotonic() + IDLE_TIMEOUT
    while time.monotonic() < deadline:
        try:
            reading = await sampler.read()
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return  # the sampler will record why; nothing to wait for
        if not (reading.get(RUNNING) or reading.get(WAITING)):
            return
        await asyncio.sleep(SAMPLE_INTERVAL)


async def run_soak(options: SoakOptions, listener: Listener) -> SoakResult:
    options.out.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    records: list[RequestRecord] = []
    samples: list[Sample] = []
    walls: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        windows = [await model_window(session, options, arm.url) for arm in options.arms()]
        urls = await metrics_urls(session, options)
        # Every engine's page, once, so that a wrong URL fails before the load.
        readings = [await first_reading(session, url, options.headers()) for url in urls]
        reading: EngineReading | None = readings[0] if readings else None
        with (
            (options.out / "requests.jsonl").open("wb") as requests_file,
            (options.out / "samples.jsonl").open("wb") as samples_file,
        ):
            on_record = _line_writer(requests_file, records)
            on_sample = _line_writer(samples_file, samples)

            def record(item: RequestRecord) -> None:
                on_record(item)
                listener.on_record(item)

            def sample(item: Sample) -> None:
                on_sample(item)
                listener.on_sample(item)

            sampler = EngineSampler(session, urls, options.headers(), sample)
            for arm in options.arms():
                if urls:
                    await _wait_idle(sampler)
                listener.start_arm(arm)
                walls[arm.name] = await _run_arm(options, arm, run_id, sampler, record)
                listener.finish_arm()
        reading = sampler.last_reading or reading
    summary: dict[str, Any] = {"target": None, "compare": None}
    for arm in options.arms():
        summary[arm.name] = arm_summary(
            [r for r in records if r.arm == arm.name],
            [s for s in samples if s.arm == arm.name],
            walls[arm.name],
        )
    summary["engine"] = engine_info(reading, windows[-1] or windows[0]).as_dict()
    run = {**options.describe(), "metrics_urls": urls, "run_id": run_id}
    (options.out / "summary.json").write_bytes(
        orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"
    )
    return SoakResult(summary, verdict(summary, options.max_kv_usage), run, records, samples)


async def _run_arm(
    options: SoakOptions,
    arm: Arm,
    run_id: str,
    sampler: EngineSampler,
    on_record: Callable[[RequestRecord], None],
) -> float:
    stop = asyncio.Event()
    started = time.monotonic()
    sampling = None
    if sampler.metrics_urls or sampler.nvidia_smi:
        sampling = asyncio.create_task(sampler.run(arm.name, started, stop))
    try:
        return await ArmDriver(options, arm, run_id, on_record).run(started)
    finally:
        stop.set()
        if sampling is not None:
            await sampling


__all__ = ["Listener", "SetupError", "SoakResult", "run_soak"]
