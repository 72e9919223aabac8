"""What KV admission costs per request: off vs the in-memory ledger vs Redis, same run.

Starts a real ``redis-server`` (loopback, no persistence), the sim upstream (answers at
once), and three ``trimproxy serve`` processes that differ only in admission:

* ``off``     ``TRIMPROXY_KV_ADMISSION=off``: the admit step is skipped
* ``memory``  ``TRIMPROXY_KV_ADMISSION=1000000000`` (never full, so nothing waits and all
  three forward the same requests), the in-memory ledger
* ``redis``   the same capacity, ``TRIMPROXY_REDIS_URL`` set: the shared ledger

Every request goes to all three proxies, one after the other in a rotating order, so
that whatever else the machine does hits all three alike. Printed per target: p50/p95
latency with the ratio against ``off``, and the CPU time per request of each proxy
process (``/proc/<pid>/stat``) and of ``redis-server``, which noise on a shared machine
disturbs far less than latency; the goal is the in-memory ledger's CPU ratio ≤ 1.05.
Redis round trips per request come from ``INFO commandstats``. A direct loop over each
ledger (no HTTP) gives the cost of one reserve + release.

    .venv/bin/python bench/admission.py                 # ~30 s
    .venv/bin/python bench/admission.py --requests 2000 --concurrency 1,8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.sessions import commandstats, cpu_seconds, pct, start_proxy, start_sim  # noqa: E402
from proxy.admission import Capacity, MemoryLedger  # noqa: E402
from proxy.admission.redis_ledger import RedisLedger  # noqa: E402
from tests.support.redis_server import REDIS_BIN, RedisServer  # noqa: E402

TARGETS = ("off", "memory", "redis")
# Commands a Lua script runs inside Redis: counted by commandstats, but no round trip.
IN_SCRIPT = frozenset(
    f"cmdstat_{c}"
    for c in ("time", "zrangebyscore", "zrem", "hdel", "hvals", "zscore", "zadd", "incr",
              "hset", "zrange", "hget", "zrank", "hexists")
)  # fmt: skip


def body(i: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are a terse assistant. " * 4}]
    for k in range(6):
        messages.append({"role": "user", "content": f"r{i} question {k}: " + "more " * 30})
        messages.append({"role": "assistant", "content": f"answer {k}: " + "fine " * 40})
    messages.append({"role": "user", "content": f"r{i} last question"})
    return {"model": "sim-model", "messages": messages, "max_tokens": 8}


async def drive(
    http: aiohttp.ClientSession, urls: dict[str, str], requests: int, c: int
) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {name: [] for name in TARGETS}
    queue = list(range(requests))

    async def post(name: str, payload: dict[str, Any]) -> None:
        began = time.perf_counter()
        async with http.post(f"{urls[name]}/v1/chat/completions", json=payload) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"bench: {name} answered {response.status}")
        latencies[name].append(time.perf_counter() - began)

    async def worker() -> None:
        while queue:
            i = queue.pop()
            shift = i % len(TARGETS)
            for name in TARGETS[shift:] + TARGETS[:shift]:
                await post(name, body(i))

    await asyncio.gather(*(worker() for _ in range(c)))
    return latencies


async def ledger_loop(make: Any, calls: int) -> float:
    """Median seconds of one reserve + release straight on a ledger (no HTTP)."""
    ledger = make()
    ledger.set_capacity(Capacity(10**9))
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        reservation = await ledger.reserve(1000, 5.0)
        reservation.release()
        await asyncio.sleep(0)  # let a Redis release go out, as between requests
        times.append(time.perf_counter() - began)
    await ledger.aclose()
    return statistics.median(times)


def report(c: int, latencies: dict[str, list[float]], cpu: dict[str, float]) -> None:
    n = len(latencies["off"])
    print(f"\nconcurrency {c}: {n} requests a target, each sent to all three in turn")
    print(f"{'target':<8} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>9} "
          f"{'proxy CPU ms/req':>16} {'CPU ratio':>9}")  # fmt: skip
    base = statistics.median(latencies["off"])
    for name in TARGETS:
        p50 = statistics.median(latencies[name])
        print(f"{name:<8} {p50 * 1e3:>8.2f} {pct(latencies[name], 0.95) * 1e3:>8.2f} "
              f"{p50 / base:>9.3f} {cpu[name] / n * 1e3:>16.3f} "
              f"{cpu[name] / cpu['off']:>9.3f}")  # fmt: skip
    print(f"redis-server CPU ms/request of the redis proxy: {cpu['redis-server'] / n * 1e3:.3f}")


async def main(args: argparse.Namespace) -> None:
    if REDIS_BIN is None:
        raise SystemExit("bench: redis-server is not installed (apt-get install redis-server)")
    procs: list[subprocess.Popen[bytes]] = []
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="trimproxy-bench-") as tmp:
        workdir = Path(tmp)
        redis = RedisServer(REDIS_BIN, workdir)
        redis.start()
        try:
            sim, sim_url = start_sim(workdir)
            procs.append(sim)
            on = {"TRIMPROXY_KV_ADMISSION": str(10**9)}
            settings = {
                "off": {},
                "memory": on,
                "redis": {**on, "TRIMPROXY_REDIS_URL": redis.url},
            }
            urls = {}
            for name in TARGETS:
                proc, urls[name] = start_proxy(name, sim_url, workdir, settings[name])
                procs.append(proc)
            pids = {name: proc.pid for name, proc in zip(TARGETS, procs[1:], strict=True)}
            assert redis.proc is not None
            pids["redis-server"] = redis.proc.pid
            connector = aiohttp.TCPConnector(limit=max(concurrencies) * 3)
            async with aiohttp.ClientSession(connector=connector) as http:
                await drive(http, urls, 30, 2)  # connections, caches, the scripts load
                before = commandstats(redis)
                for c in concurrencies:
                    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    latencies = await drive(http, urls, args.requests, c)
                    cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
                    results.append((c, latencies, cpu))
                after = commandstats(redis)
            redis_loop = await ledger_loop(
                lambda: RedisLedger(redis.url, "http://bench", MemoryLedger(None)), 600
            )
            memory_loop = await ledger_loop(lambda: MemoryLedger(None), 600)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
            redis.stop()

    print("requests of 13 messages (~600 approx tokens), max_tokens 8; sim upstream")
    for c, latencies, cpu in results:
        report(c, latencies, cpu)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    top = {k: v for k, v in delta.items() if v and k not in IN_SCRIPT}
    requests = sum(len(lat["redis"]) for _, lat, _ in results)
    print(f"\nredis, during the load: {requests} requests through the redis proxy")
    print(f"  commands sent (round trips): {top}")
    print(f"  round trips per request: {sum(top.values()) / max(1, requests):.3f}")
    print(f"one reserve + release straight on the ledger, median: redis "
          f"{redis_loop * 1e3:.3f} ms, memory {memory_loop * 1e6:.1f} us")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="requests a phase [600]")
    parser.add_argument(
        "--concurrency", default="1,8", help="comma-separated requests in flight [1,8]"
    )
    asyncio.run(main(parser.parse_args()))
