"""What session limits cost per request: no sessions vs in-memory vs Redis, same run.

Starts a real ``redis-server`` (loopback, no persistence), the sim upstream, and three
``trimproxy serve`` processes that differ only in their session settings:

* ``none``    no session limit: the session step is skipped
* ``memory``  ``TRIMPROXY_SESSION_MAX_TURNS=1000`` (a limit that is never hit, so all
  three forward the same prompts), in-memory store
* ``redis``   the same limit, ``TRIMPROXY_REDIS_URL`` set

Then it drives growing multi-turn conversations (each request one turn longer, an
``X-Session-ID`` each). Every turn goes to all three proxies, one after the other in
a rotating order, so that whatever else the machine does hits all three alike; it
prints per target the p50/p95 latency with the ratio and added milliseconds against
``none``, and the CPU time per request of each proxy process (``/proc/<pid>/stat``)
and of ``redis-server``, which noise on a shared machine disturbs far less.

Round trips: ``INFO commandstats`` before and after the load gives the commands Redis
ran (one command is one round trip here: nothing is pipelined); divided by the
requests that went through the ``redis`` proxy. A direct loop over the store
(no HTTP) gives the client-side time of one round trip.

    .venv/bin/python bench/sessions.py               # ~20 s
    .venv/bin/python bench/sessions.py --sessions 16 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from proxy.sessions.identity import hash_conversation  # noqa: E402
from proxy.sessions.memory import MemoryStore  # noqa: E402
from proxy.sessions.redis_store import RedisStore  # noqa: E402
from proxy.sessions.rule import Limits  # noqa: E402
from proxy.sessions.store import SessionStore  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from tests.support.redis_server import REDIS_BIN, RedisServer  # noqa: E402

SIM_READY = "trimproxy-sim listening on "  # proxy.sim.cli.READY_PREFIX
TARGETS = ("none", "memory", "redis")
TURNS = 12  # each conversation grows to this many user turns


def spawn(
    args: list[str], workdir: Path, name: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    log = (workdir / f"{name}.log").open("wb")
    with log:
        return subprocess.Popen(args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def base_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def wait_for(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise SystemExit(f"bench: {what} did not start within {timeout:.0f} s")


def start_sim(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = {"dialect": "vllm", "max_model_len": 32768, "kv_blocks": 1_000_000}
    args = [sys.executable, "-m", "proxy.sim", "--host", "127.0.0.1", "--port", "0",
            "--config-json", json.dumps(config)]  # fmt: skip
    proc = spawn(args, workdir, "sim", base_env({}))

    def ready() -> str | None:
        for line in (workdir / "sim.log").read_text(errors="replace").splitlines():
            if line.startswith(SIM_READY):
                return line[len(SIM_READY) :].strip()
        return None

    return proc, wait_for(ready, "the sim")


def start_proxy(
    name: str, upstream: str, workdir: Path, settings: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    import urllib.request

    port = free_port()
    env = base_env({"TRIMPROXY_UPSTREAM_URL": upstream, "TRIMPROXY_TOKENIZER": "approx",
                    "TRIMPROXY_LOG_LEVEL": "warning", **settings})  # fmt: skip
    args = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = spawn(args, workdir, name, env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return proc.poll() is not None and bool(sys.exit(f"bench: proxy {name} exited"))

    wait_for(healthy, f"proxy {name}")
    return proc, url


def conversation(users: int, session: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a terse assistant. " * 4}]
    for i in range(users):
        messages.append({"role": "user", "content": f"s{session} question {i}: " + "more " * 30})
        if i < users - 1:
            messages.append({"role": "assistant", "content": f"answer {i}: " + "fine " * 40})
    return messages


def commandstats(server: RedisServer) -> dict[str, int]:
    with server.client() as client:
        stats = client.info("commandstats")
    return {name: int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info"}


async def drive(
    http: aiohttp.ClientSession, urls: dict[str, str], tag: str, sessions: int, c: int
) -> dict[str, list[float]]:
    """``sessions`` conversations of TURNS requests to every target, ``c`` at a time."""
    latencies: dict[str, list[float]] = {name: [] for name in TARGETS}
    queue = list(range(sessions))

    async def post(name: str, body: dict[str, Any], sid: str) -> None:
        began = time.perf_counter()
        url = f"{urls[name]}/v1/chat/completions"
        async with http.post(url, json=body, headers={"x-session-id": sid}) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"bench: {name} answered {response.status}")
        latencies[name].append(time.perf_counter() - began)

    async def worker() -> None:
        while queue:
            session = queue.pop()
            for users in range(1, TURNS + 1):
                body = {"model": "sim-model", "messages": conversation(users, session)}
                shift = (session + users) % len(TARGETS)
                for name in TARGETS[shift:] + TARGETS[:shift]:
                    await post(name, {**body, "max_tokens": 8}, f"{tag}-{session}")

    await asyncio.gather(*(worker() for _ in range(c)))
    return latencies


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def store_round_trip(store: SessionStore, calls: int) -> float:
    """Median seconds of one ``admit`` straight on the store (no HTTP, no proxy)."""
    limits = Limits(1000, None, "reset", 3600)
    probes = [hash_conversation(conversation(u, 0)) for u in range(1, TURNS + 1)]
    times = []
    for i in range(calls):
        began = time.perf_counter()
        await store.admit(f"bench-{i // TURNS}", probes[i % TURNS], limits)
        times.append(time.perf_counter() - began)
    await store.aclose()
    return statistics.median(times)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Commands the Lua script runs inside Redis: counted by commandstats, but no round trip.
IN_SCRIPT = frozenset(("cmdstat_get", "cmdstat_set", "cmdstat_time"))


def report(c: int, latencies: dict[str, list[float]], cpu: dict[str, float]) -> None:
    n = len(latencies["none"])
    print(f"\nconcurrency {c}: {n} requests a target, each turn sent to all three in turn")
    print(f"{'target':<8} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>9} {'p50 +ms':>8} "
          f"{'proxy CPU ms/req':>16} {'CPU ratio':>9}")  # fmt: skip
    base = statistics.median(latencies["none"])
    for name in TARGETS:
        p50, cpu_ms = statistics.median(latencies[name]), cpu[name] / n * 1e3
        print(f"{name:<8} {p50 * 1e3:>8.2f} {pct(latencies[name], 0.95) * 1e3:>8.2f} "
              f"{p50 / base:>9.3f} {(p50 - base) * 1e3:>8.2f} {cpu_ms:>16.3f} "
              f"{cpu[name] / cpu['none']:>9.3f}")  # fmt: skip
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
            limit = {"TRIMPROXY_SESSION_MAX_TURNS": "1000"}
            redis_url = {"TRIMPROXY_REDIS_URL": redis.url}
            settings = {"none": {}, "memory": limit, "redis": {**limit, **redis_url}}
            urls = {}
            for name in TARGETS:
                proc, urls[name] = start_proxy(name, sim_url, workdir, settings[name])
                procs.append(proc)
            pids = {name: proc.pid for name, proc in zip(TARGETS, procs[1:], strict=True)}
            assert redis.proc is not None
            pids["redis-server"] = redis.proc.pid
            connector = aiohttp.TCPConnector(limit=max(concurrencies) * 3)
            async with aiohttp.ClientSession(connector=connector) as http:
                await drive(http, urls, "warm", 2, 2)  # connections, caches, the script load
                before = commandstats(redis)
                for c in concurrencies:
                    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    latencies = await drive(http, urls, f"c{c}", args.sessions, c)
                    cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
                    results.append((c, latencies, cpu))
                after = commandstats(redis)
            direct_redis = await store_round_trip(RedisStore(redis.url), 600)
            direct_memory = await store_round_trip(MemoryStore(10_000), 600)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
            redis.stop()

    print(f"conversations of 1..{TURNS} user turns, one X-Session-ID each; sim upstream")
    for c, latencies, cpu in results:
        report(c, latencies, cpu)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    top = {k: v for k, v in delta.items() if v and k not in IN_SCRIPT}
    inner = {k: v for k, v in delta.items() if v and k in IN_SCRIPT}
    requests = sum(len(lat["redis"]) for _, lat, _ in results)
    print(f"\nredis, during the load: {requests} requests through the redis proxy")
    print(f"  commands sent (round trips): {top}")
    print(f"  commands run inside the script: {inner}")
    print(f"  round trips per request: {sum(top.values()) / max(1, requests):.3f}")
    print(f"one admit straight on the store, median: redis {direct_redis * 1e3:.3f} ms, "
          f"memory {direct_memory * 1e3:.4f} ms")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=48, help="conversations a phase [48]")
    parser.add_argument(
        "--concurrency", default="1,8", help="comma-separated requests in flight [1,8]"
    )
    asyncio.run(main(parser.parse_args()))
