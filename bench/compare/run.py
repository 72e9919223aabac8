"""The three measurements, and the process pool that runs the slow ones.

Timing runs alone in the main process, so no other work of the bench competes with
it. The sweep and the prefix-reuse runs are independent jobs (one per trimmer and
shape); they go to a pool of forked workers, one per core, because native LiteLLM
takes a large share of the run and the other core would sit idle. Workers rebuild
their trimmer from its name: the conversations are seeded, so every process sees
the same messages.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench.compare import conversations, counting, metrics, trimmers
from bench.compare.counting import SharedCounter
from bench.compare.trimmers import Message, Trimmer
from proxy.trimming import TrimPolicy, trim
from proxy.types import PromptCount

ALL = ("trimproxy", *trimmers.PEERS)
REFERENCE_BUDGET = 8000
#: Other low-water marks the reuse run tries on trimproxy (it is fast enough).
OTHER_TARGETS = (0.4, 0.5, 0.7, 0.8)


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool = False
    counter: str = "tiktoken:cl100k_base"
    trimmers: tuple[str, ...] = ALL
    shapes: tuple[str, ...] = conversations.SHAPES
    seed: int = 0
    budget: int = REFERENCE_BUDGET
    target: float = 0.6
    turns: int | None = None
    jobs: int = os.cpu_count() or 1

    @property
    def growing_turns(self) -> int:
        return self.turns or (120 if self.quick else 200)

    @property
    def budgets(self) -> list[int]:
        return list(range(1000, 16001, 1500 if self.quick else 250))

    @property
    def reps(self) -> tuple[int, float]:
        """Timed calls per cell, and the CPU seconds after which a cell stops early."""
        return (3, 0.2) if self.quick else (30, 0.6)

    @property
    def slow_stride(self) -> int:
        """Native LiteLLM re-tokenizes the kept history for every message it looks
        at, seconds per call on a long history: its reuse run samples every n-th pair."""
        return 40 if self.quick else 20


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("trimproxy", "litellm", "langchain-core", "tiktoken"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# -- timing ---------------------------------------------------------------------------


async def time_calls(
    trimmer: Trimmer,
    messages: Sequence[Message],
    budget: int,
    *,
    cold: bool,
    reps: int,
    cap_s: float,
) -> dict[str, float]:
    """At least 5 (quick: 3) and at most ``reps`` timed calls, stopping once ``cap_s`` of CPU is
    spent, so the slow peers do not stretch the run while the fast ones get enough
    samples. CPU is the process's, not the thread's: the proxy's tiktoken counter
    encodes long texts in a worker thread, and tiktoken's batch encoder in several."""
    gc.collect()
    if not cold:
        await trimmer(messages, budget)  # fills the count cache: every later call is warm
    wall: list[float] = []
    cpu: list[float] = []
    while len(wall) < reps and (len(wall) < min(5, reps) or sum(cpu) < cap_s):
        if cold:
            trimmer.fresh()
        t0, c0 = time.perf_counter(), time.process_time()
        await trimmer(messages, budget)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return metrics.timing(wall, cpu)


def time_trim_only(
    messages: Sequence[Message], budget: int, counter: SharedCounter, target: float, reps: int
) -> dict[str, float]:
    """trimproxy's ``trim`` alone, counts given: the part of the request path that
    is trimming proper, whatever the counter costs."""
    count = PromptCount(counter.per_message(messages), counting.REPLY_PRIMING)
    policy = TrimPolicy(budget=budget, target=target)
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        trim(messages, count, policy)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return metrics.timing(wall, cpu)


async def timing_phase(cfg: Config, counter: SharedCounter, log: Callable[[str], None]) -> Any:
    convs = {s: conversations.generate(s, cfg.seed) for s in cfg.shapes}
    names = list(cfg.trimmers)
    if "langchain" in names:
        names.append("langchain/uncached")
    if "trimproxy" in names and trimmers.proxy_counter_trimproxy(cfg.target) is not None:
        names.insert(1, "trimproxy/proxy-counter")
    reps, cap = cfg.reps
    tiny = conversations.chat(cfg.seed, turns=3)
    out: dict[str, Any] = {}
    for name in names:
        t = trimmers.build(name, counter, cfg.target)
        # First calls pay for lazy imports and one-time set-up inside the libraries;
        # that is no property of trimming, so it happens before any timed call.
        await t(tiny, cfg.budget)
        out[name] = {}
        for s, m in convs.items():
            out[name][s] = {
                "cold": await time_calls(t, m, cfg.budget, cold=True, reps=reps, cap_s=cap),
                "warm": await time_calls(t, m, cfg.budget, cold=False, reps=reps, cap_s=cap),
            }
        log(f"timed {name}")
    if "trimproxy" in names:
        out["trimproxy trim() only"] = {
            s: {"warm": time_trim_only(m, cfg.budget, counter, cfg.target, reps * 4)}
            for s, m in convs.items()
        }
    return out


# -- sweep and reuse (worker jobs) ------------------------------------------------------


async def _sweep(
    trimmer: Trimmer, messages: Sequence[Message], budgets: Sequence[int], counter: SharedCounter
) -> list[dict[str, Any]]:
    rows = []
    for b in budgets:
        out = await trimmer(messages, b)
        c = metrics.check(messages, out, b, counter.prompt_tokens)
        rows.append(
            {"budget": b, **c.as_dict(), "violations": c.violations, "error": trimmer.last_error}
        )
    return rows


def sweep_job(cfg: Config, name: str, shape: str) -> list[dict[str, Any]]:
    counter = counting.build(cfg.counter)
    trimmer = trimmers.build(name, counter, cfg.target)
    messages = conversations.generate(shape, cfg.seed)
    return asyncio.run(_sweep(trimmer, messages, cfg.budgets, counter))


async def _reuse(
    trimmer: Trimmer,
    requests: Sequence[Sequence[Message]],
    budget: int,
    counter: SharedCounter,
    stride: int,
) -> dict[str, Any]:
    run_at = set(range(len(requests)))
    if stride > 1:
        run_at = {j for k in range(stride, len(requests), stride) for j in (k - 1, k)}
    forwarded: list[metrics.Forwarded] = [
        await trimmer(r, budget) if k in run_at else metrics.NOT_RUN for k, r in enumerate(requests)
    ]
    r = metrics.prefix_reuse(
        requests, forwarded, budget, counter.message_tokens, counter.prompt_tokens
    )
    return {
        "reuse": r.reuse,
        "mean_share": r.mean_share,
        "stable": r.stable,
        "fill": r.fill,
        "ceiling": r.ceiling,
        "requests": len(requests),
        "pairs": len(r.shares),
        "stride": stride,
        "refused": sum(f is None for f in forwarded),
        "shares": [round(x, 4) for x in r.shares],
    }


def reuse_job(cfg: Config, name: str, target: float | None = None) -> dict[str, Any]:
    """Forward every request of the growing conversation; for native LiteLLM only the
    pairs (k-1, k) of every ``slow_stride``-th k, since reuse is a property of
    consecutive pairs."""
    counter = counting.build(cfg.counter)
    if target is None:
        trimmer = trimmers.build(name, counter, cfg.target)
    else:
        trimmer = trimmers.shared_trimproxy(counter, target)
    requests = conversations.growing_requests(conversations.chat(cfg.seed, cfg.growing_turns))
    stride = cfg.slow_stride if name == "litellm" else 1
    return asyncio.run(_reuse(trimmer, requests, cfg.budget, counter, stride))


def summarise_sweep(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Runs (budget x shape), not messages, with each violation: the question is
    how often a user's request goes out broken."""
    return {
        "budgets": len(rows),
        "refused": sum(r["refused"] for r in rows),
        "over_budget": sum(r["over_budget"] for r in rows),
        "altered": sum(r["altered"] > 0 for r in rows),
        "orphaned": sum(r["orphaned"] > 0 for r in rows),
        "non_user_start": sum(r["non_user_start"] for r in rows),
        "system_lost": sum(r["system_lost"] for r in rows),
        "last_user_lost": sum(r["last_user_lost"] for r in rows),
        "passthrough": sum(r["passthrough"] for r in rows),
        "caught_errors": sum(r["error"] is not None for r in rows),
        "any_violation": sum(r["violations"] > 0 for r in rows),
        "max_over_tokens": max(
            (r["tokens"] - r["budget"] for r in rows if r["over_budget"]), default=0
        ),
    }


# -- the whole run ----------------------------------------------------------------------


def run(cfg: Config, command: str) -> dict[str, Any]:
    started = time.perf_counter()
    load_before = os.getloadavg()

    def log(what: str) -> None:
        print(f"  {what}  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    counter = counting.build(cfg.counter)
    convs = {s: conversations.generate(s, cfg.seed) for s in cfg.shapes}
    growing = conversations.growing_requests(conversations.chat(cfg.seed, cfg.growing_turns))
    built = {name: trimmers.build(name, counter, cfg.target) for name in cfg.trimmers}
    budgets = cfg.budgets
    result: dict[str, Any] = {
        "command": command,
        "machine": machine(),
        "versions": versions(),
        "counter": counter.name,
        "budget": cfg.budget,
        "target": cfg.target,
        "seed": cfg.seed,
        "sweep_budgets": [budgets[0], budgets[-1], budgets[1] - budgets[0]],
        "trimmers": {n: t.note for n, t in built.items()},
        "shapes": {
            s: {"messages": len(m), "tokens": counter.prompt_tokens(m)} for s, m in convs.items()
        },
    }
    if any(n.startswith("litellm") for n in built):
        # How far LiteLLM's own counting is from the shared one, per shape.
        lit = trimmers._import_litellm()
        for s, m in convs.items():
            result["shapes"][s]["litellm_tokens"] = lit.token_counter(messages=m)

    result["timing"] = asyncio.run(timing_phase(cfg, counter, log))

    # Slowest jobs first, so the pool does not end on one long job.
    jobs: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
    for name in cfg.trimmers:
        jobs.append((f"reuse {name}", reuse_job, (cfg, name)))
        jobs.extend((f"sweep {name} {s}", sweep_job, (cfg, name, s)) for s in cfg.shapes)
    if "trimproxy" in cfg.trimmers:
        jobs.extend(
            (f"reuse trimproxy target={t}", reuse_job, (cfg, "trimproxy", t))
            for t in OTHER_TARGETS
            if t != cfg.target
        )
    jobs.sort(key=lambda j: not j[0].startswith(("reuse litellm", "sweep litellm ")))
    done: dict[str, Any] = {}
    if cfg.jobs <= 1:
        for key, fn, fargs in jobs:
            done[key] = fn(*fargs)
    else:
        # fork: workers inherit the imported libraries (LiteLLM takes seconds to import).
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=ctx) as pool:
            futures: dict[str, Future[Any]] = {k: pool.submit(fn, *a) for k, fn, a in jobs}
            for key, fut in futures.items():
                done[key] = fut.result()
    log("swept and replayed")

    result["sweep"] = {}
    for name in cfg.trimmers:
        per_shape = {s: done[f"sweep {name} {s}"] for s in cfg.shapes}
        result["sweep"][name] = {
            "total": summarise_sweep([r for rows in per_shape.values() for r in rows]),
            "by_shape": {s: summarise_sweep(rows) for s, rows in per_shape.items()},
            "errors": sorted(
                {r["error"] for rows in per_shape.values() for r in rows if r["error"]}
            ),
            "rows": per_shape,
        }
    by = {name: done[f"reuse {name}"] for name in cfg.trimmers}
    by.update(
        {
            key.removeprefix("reuse "): value
            for key, value in done.items()
            if key.startswith("reuse trimproxy target=")
        }
    )
    result["reuse"] = {
        "conversation": f"chat, {cfg.growing_turns} turns, one request per turn",
        "messages": len(growing[-1]),
        "tokens": counter.prompt_tokens(growing[-1]),
        "by_trimmer": by,
    }
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result
