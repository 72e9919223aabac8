"""Proxy overhead, side by side, against a fast mock upstream.

Runs ``wrk`` (POSTing a ~2k-token, 20-message chat body) at several concurrencies,
non-streaming and streaming, against:

* ``direct``       the sim (vLLM dialect, answers at once, 16 tokens / 16 SSE chunks)
* ``trimproxy``    ``trimproxy serve``, ``TRIMPROXY_TOKENIZER=approx``, nothing trimmed
* ``trimproxy-trim`` the same with a budget that trims every request
* ``trimproxy-hf``  ``TRIMPROXY_TOKENIZER=hf:<the test suite's tiny chat tokenizer>``,
  nothing trimmed
* ``trimproxy-hf-trim`` the same, trimming every request
* ``trimproxy-base`` ``trimproxy`` from another checkout (``--baseline DIR``): before/after
* ``trimproxy-hf-base`` ``trimproxy-hf`` from that checkout
* ``trimproxy-trim-base`` ``trimproxy-trim`` from that checkout
* ``trimproxy-trim-noladder`` ``trimproxy-trim`` with the trim ladder off
  (``TRIMPROXY_CLEAR_TOOL_OUTPUTS=off``): the ladder's own share of a trimmed request
* ``trimproxy-starlette`` ``trimproxy`` as a plain Starlette app (``starlette_app.py``):
  what FastAPI's own layers cost; ``trimproxy-trim-starlette`` the same, trimming
* ``floor``        a bare FastAPI + aiohttp-client passthrough (``floor_fastapi_aiohttp.py``)
* ``floor-aiohttp`` a bare aiohttp-server + aiohttp-client passthrough (``floor_aiohttp.py``):
  the cheapest Python proxy, so ``/aio`` says how far from the Python limit a target is
* ``floor-uvicorn`` uvicorn serving a bare ASGI callable + an aiohttp client
  (``floor_uvicorn_aiohttp.py``): trimproxy's server without a framework on it
* ``naive``        FastAPI + ``request.json()`` + httpx (``naive_fastapi_httpx.py``)

Modes: ``plain`` (non-streamed), ``stream`` (16 SSE events sent at once) and ``paced``
(streamed at an engine's pace: the sim turned to ``PACE`` tokens/s and ``PACED_TOKENS``
events an answer through its ``/_sim/config``, so every event is a wake-up of its own,
as from a real engine, instead of a burst that one read takes in).

It reports req/s, p50/p99 latency (``wrk --latency``), and CPU seconds per request
of the proxy process (``utime+stime`` from ``/proc/<pid>/stat`` before and after the
cell), with ratios against ``direct``, ``floor`` and ``floor-aiohttp``. One target runs at a
time; the sim stays up throughout. Results also go to ``bench/results/overhead.json``.

    .venv/bin/python bench/overhead.py            # ~2.5 min: 5 s a cell
    .venv/bin/python bench/overhead.py --quick    # smoke run: 1 s a cell
    .venv/bin/python bench/overhead.py --targets direct,trimproxy,floor -c 16
    .venv/bin/python bench/overhead.py --modes plain -c 16,64 --seconds 3 \
        --targets trimproxy,trimproxy-hf,floor,floor-aiohttp      # against both floors

Needs ``wrk`` on PATH (``apt-get install wrk``) and Linux ``/proc``; installs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results" / "overhead.json"
SIM_READY = "trimproxy-sim listening on "  # proxy.sim.cli.READY_PREFIX
CHAT_PATH = "/v1/chat/completions"
CONTEXT = 32_768
TRIM_BUDGET = 1_000
# The paced mode: the tiny CPU vLLM's decode pace at 16 streams, and vllm_serve.py's
# 64 output tokens.
PACE = 160.0
PACED_TOKENS = 64
_SIM_KNOBS = {
    "plain": {"tokens_per_second": 0.0, "completion_tokens": 16},
    "stream": {"tokens_per_second": 0.0, "completion_tokens": 16},
    "paced": {"tokens_per_second": PACE, "completion_tokens": PACED_TOKENS},
}
ALL_TARGETS = (
    "direct",
    "trimproxy",
    "trimproxy-trim",
    "trimproxy-hf",
    "trimproxy-hf-trim",
    "trimproxy-base",
    "trimproxy-hf-base",
    "trimproxy-trim-base",
    "trimproxy-trim-noladder",
    "trimproxy-starlette",
    "trimproxy-trim-starlette",
    "floor",
    "floor-aiohttp",
    "floor-uvicorn",
    "naive",
)
DEFAULT_TARGETS = ("direct", "trimproxy", "trimproxy-trim", "trimproxy-hf", "floor",
                   "floor-aiohttp", "naive")  # fmt: skip
FLOOR = "floor"
AIO_FLOOR = "floor-aiohttp"
FLOOR_SCRIPTS = {
    "floor": "floor_fastapi_aiohttp.py",
    "floor-aiohttp": "floor_aiohttp.py",
    "floor-uvicorn": "floor_uvicorn_aiohttp.py",
    "naive": "naive_fastapi_httpx.py",
}


# -- processes ------------------------------------------------------------------------


class BenchError(Exception):
    """A target misbehaves; the run stops and says why."""


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def logs(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.update(extra)
    return env


def _spawn(name: str, args: list[str], workdir: Path, env: dict[str, str]) -> Server:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        # cwd is a scratch dir: a .env in the checkout must not change the settings.
        process = subprocess.Popen(
            args, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Server(name, "", process, log_path)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fail(server: Server, why: str) -> None:
    server.stop()
    raise SystemExit(f"{server.name} did not start ({why}):\n{server.logs()[-4000:]}")


def _wait_http(server: Server, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            _fail(server, f"exit {server.process.returncode}")
        try:
            with urllib.request.urlopen(server.url + path, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    _fail(server, f"no 200 from {path} in {timeout:.0f}s")


def start_sim(workdir: Path) -> Server:
    config = {
        "dialect": "vllm",
        "max_model_len": CONTEXT,
        "tokens_per_second": 0,
        "completion_tokens": 16,
        "kv_blocks": 1_000_000,  # never queue: this measures the proxies, not the cache
        "record_limit": 64,
    }
    args = [sys.executable, "-m", "proxy.sim", "--host", "127.0.0.1", "--port", "0",
            "--config-json", json.dumps(config)]  # fmt: skip
    server = _spawn("sim", args, workdir, _env({}))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in server.logs().splitlines():
            if line.startswith(SIM_READY):
                server.url = line[len(SIM_READY) :].strip()
                return server
        if server.process.poll() is not None:
            break
        time.sleep(0.05)
    _fail(server, "no ready line")
    raise AssertionError("unreachable")


def hf_tokenizer(workdir: Path) -> Path:
    """The test suite's tiny ChatML tokenizer (trained offline, cached under .cache)."""
    from tests.support.tiny_model import build_tokenizer

    return build_tokenizer(workdir / "tokenizer")


def target_flags(name: str) -> list[str]:
    """What a ``trimproxy-*`` target's name asks for: ``hf``, ``trim``, ``base``,
    ``starlette``, ``noladder``."""
    return name.split("-")[1:]


def start_target(name: str, sim: Server, workdir: Path, baseline: Path | None = None) -> Server:
    port = _free_port()
    if name.startswith("trimproxy"):
        flags = target_flags(name)
        tokenizer = f"hf:{hf_tokenizer(workdir)}" if "hf" in flags else "approx"
        settings = {
            "TRIMPROXY_UPSTREAM_URL": sim.url,
            "TRIMPROXY_TOKENIZER": tokenizer,
            "TRIMPROXY_CONTEXT_WINDOW": str(CONTEXT),
        }
        if "trim" in flags:
            settings["TRIMPROXY_MAX_PROMPT_TOKENS"] = str(TRIM_BUDGET)
        if "noladder" in flags:
            settings["TRIMPROXY_CLEAR_TOOL_OUTPUTS"] = "off"
        serve = [sys.executable, "-m", "proxy.cli"]
        if "starlette" in flags:
            serve = [sys.executable, str(BENCH / "starlette_app.py")]
        args = [*serve, "serve", "--host", "127.0.0.1", "--port", str(port)]
        env = _env(settings)
        if "base" in flags:
            if baseline is None:
                raise SystemExit(f"target {name} needs --baseline DIR")
            env["PYTHONPATH"] = os.pathsep.join((str(baseline.resolve()), env["PYTHONPATH"]))
        server = _spawn(name, args, workdir, env)
    else:
        return start_floor(name, sim.url, workdir)
    server.url = f"http://127.0.0.1:{port}"
    _wait_http(server, "/healthz")
    return server


def start_floor(name: str, upstream: str, workdir: Path) -> Server:
    """One of the bare passthroughs (``FLOOR_SCRIPTS``) in front of ``upstream``."""
    port = _free_port()
    args = [sys.executable, str(BENCH / FLOOR_SCRIPTS[name]), "--port", str(port),
            "--upstream", upstream]  # fmt: skip
    server = _spawn(name, args, workdir, _env({}))
    server.url = f"http://127.0.0.1:{port}"
    _wait_http(server, "/healthz")
    return server


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, seconds (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the request body ---------------------------------------------------------------------

_TEXT = (
    "the model server keeps a cache of every token in the prompt so long chats grow the "
    "memory until the budget stops them please summarise the report and list three risks "
    "with numbers from the table then explain how the plan changes when traffic doubles"
)


def chat_body(stream: bool, target_tokens: int = 2_000) -> bytes:
    """20 messages (system, then user/assistant turns, ending with a user turn) of about
    ``target_tokens`` sim tokens (4 bytes a token) in all; deterministic."""
    rng = random.Random(7)
    vocabulary = _TEXT.split()
    per_message = target_tokens * 4 // 20
    messages: list[dict[str, str]] = []
    for i in range(20):
        role = "system" if i == 0 else ("user" if i % 2 == 1 else "assistant")
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < per_message:
            words.append(rng.choice(vocabulary))
        messages.append({"role": role, "content": " ".join(words)})
    if messages[-1]["role"] != "user":
        messages[-1]["role"] = "user"
    body: dict[str, Any] = {"model": "sim-model", "messages": messages, "max_tokens": 64}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


# -- wrk ----------------------------------------------------------------------------------


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int = 0
    socket_errors: int = 0
    raw: str = field(default="", repr=False)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def parse_wrk(text: str) -> WrkResult:
    def latency(pct: str) -> float:
        match = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
        return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    total = re.search(r"(\d+) requests in", text)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    return WrkResult(
        rps=float(rps.group(1)) if rps else 0.0,
        p50_ms=latency("50"),
        p99_ms=latency("99"),
        requests=int(total.group(1)) if total else 0,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(g) for g in sockets.groups()) if sockets else 0,
        raw=text,
    )


def run_wrk(url: str, body_file: Path, connections: int, seconds: float) -> WrkResult:
    # One wrk thread: on a 2-core box the load generator must not take a core of its own
    # from the processes measured more than it has to.
    args = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
            "--timeout", "10s", "-s", str(BENCH / "wrk_post.lua"), url + CHAT_PATH]  # fmt: skip
    done = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, "WRK_BODY_FILE": str(body_file)},
        check=False, timeout=seconds + 60,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return parse_wrk(done.stdout)


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Row:
    target: str
    mode: str
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    cpu_ms_per_req: float | None
    sim_cpu_ms_per_req: float
    rps_vs_direct: float | None = None
    rps_vs_floor: float | None = None
    cpu_vs_floor: float | None = None
    p99_vs_floor: float | None = None
    rps_vs_aio: float | None = None
    cpu_vs_aio: float | None = None
    p50_added_ms: float | None = None


def measure(target: Server | None, sim: Server, url: str, body_file: Path, mode: str,
            connections: int, seconds: float) -> Row:  # fmt: skip
    pid = target.pid if target is not None else None
    cpu0 = cpu_seconds(pid) if pid else 0.0
    sim0 = cpu_seconds(sim.pid)
    result = run_wrk(url, body_file, connections, seconds)
    cpu1 = cpu_seconds(pid) if pid else 0.0
    sim1 = cpu_seconds(sim.pid)
    n = max(result.requests, 1)
    return Row(
        target=target.name if target is not None else "direct",
        mode=mode,
        connections=connections,
        rps=result.rps,
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        requests=result.requests,
        errors=result.non_2xx + result.socket_errors,
        cpu_ms_per_req=(cpu1 - cpu0) / n * 1e3 if pid else None,
        sim_cpu_ms_per_req=(sim1 - sim0) / n * 1e3,
    )


def pace_sim(sim: Server, mode: str) -> None:
    """Set the sim's pace for ``mode`` (its ``/_sim/config``), before a cell of it."""
    request = urllib.request.Request(
        sim.url + "/_sim/config",
        data=json.dumps(_SIM_KNOBS[mode]).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()


def check_trimming(url: str, body: bytes, expect_trim: bool) -> str:
    """One request through the proxy: did it trim as this variant should?"""
    request = urllib.request.Request(
        url + CHAT_PATH, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
            trimmed = resp.headers.get("X-Trimproxy-Trimmed-Messages")
            forwarded = resp.headers.get("X-Trimproxy-Prompt-Tokens")
    except urllib.error.HTTPError as exc:
        raise BenchError(f"{url} answered {exc.code}: {exc.read()[:2000]!r}") from None
    dropped = int(trimmed or 0)
    if expect_trim != (dropped > 0):
        print(f"  warning: expected {'a' if expect_trim else 'no'} trim, got {dropped} dropped")
    return f"dropped {dropped} messages, forwarded {forwarded} (approx) tokens"


def add_ratios(rows: list[Row]) -> None:
    by_key = {(r.target, r.mode, r.connections): r for r in rows}
    for row in rows:
        direct = by_key.get(("direct", row.mode, row.connections))
        floor = by_key.get((FLOOR, row.mode, row.connections))
        aio = by_key.get((AIO_FLOOR, row.mode, row.connections))
        if direct is not None and direct.rps:
            row.rps_vs_direct = row.rps / direct.rps
            row.p50_added_ms = row.p50_ms - direct.p50_ms
        if floor is not None and floor.rps:
            row.rps_vs_floor = row.rps / floor.rps
            if floor.p99_ms:
                row.p99_vs_floor = row.p99_ms / floor.p99_ms
            if row.cpu_ms_per_req is not None and floor.cpu_ms_per_req:
                row.cpu_vs_floor = row.cpu_ms_per_req / floor.cpu_ms_per_req
        if aio is not None and aio.rps:
            row.rps_vs_aio = row.rps / aio.rps
            if row.cpu_ms_per_req is not None and aio.cpu_ms_per_req:
                row.cpu_vs_aio = row.cpu_ms_per_req / aio.cpu_ms_per_req


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row]) -> None:
    head = (f"{'mode':<7}{'c':>4}  {'target':<18}{'req/s':>8}{'/direct':>8}{'/floor':>7}"
            f"{'/aio':>6}{'p50 ms':>8}{'+p50':>7}{'p99 ms':>8}{'/floor':>7}{'CPU ms/req':>11}"
            f"{'/floor':>7}{'/aio':>6}{'sim ms/req':>11}{'errors':>7}")  # fmt: skip
    print(head)
    print("-" * len(head))
    last: tuple[str, int] | None = None
    for r in sorted(rows, key=lambda r: (r.mode, r.connections, ALL_TARGETS.index(r.target))):
        if last is not None and last != (r.mode, r.connections):
            print()
        last = (r.mode, r.connections)
        print(
            f"{r.mode:<7}{r.connections:>4}  {r.target:<18}{r.rps:>8.0f}"
            f"{_fmt(r.rps_vs_direct, '.2f'):>8}{_fmt(r.rps_vs_floor, '.2f'):>7}"
            f"{_fmt(r.rps_vs_aio, '.2f'):>6}"
            f"{r.p50_ms:>8.2f}{_fmt(r.p50_added_ms, '+.2f'):>7}{r.p99_ms:>8.2f}"
            f"{_fmt(r.p99_vs_floor, '.2f'):>7}"
            f"{_fmt(r.cpu_ms_per_req, '.3f'):>11}{_fmt(r.cpu_vs_floor, '.2f'):>7}"
            f"{_fmt(r.cpu_vs_aio, '.2f'):>6}"
            f"{r.sim_cpu_ms_per_req:>11.3f}{r.errors:>7}"
        )


def _load_average() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "orjson", "uvloop"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    out["wrk"] = (wrk.stdout or wrk.stderr).splitlines()[0] if (wrk.stdout or wrk.stderr) else "?"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s cells, smoke test")
    parser.add_argument("--seconds", type=float, default=None, help="seconds a cell [5]")
    parser.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated subset of {','.join(ALL_TARGETS)} [{','.join(DEFAULT_TARGETS)}]",
    )
    parser.add_argument(
        "-c",
        "--connections",
        default="1,16,64",
        help="comma-separated wrk connection counts [1,16,64]",
    )
    parser.add_argument("--modes", default="plain,stream", help="plain,stream,paced")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"[{RESULTS}]")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout's root, for the -base targets",
    )
    args = parser.parse_args(argv)  # fmt: skip

    if shutil.which("wrk") is None:
        print("bench/overhead.py needs wrk on PATH (Debian/Ubuntu: apt-get install wrk); "
              "it installs nothing itself.", file=sys.stderr)  # fmt: skip
        return 2
    if not Path("/proc/self/stat").exists():
        print("bench/overhead.py reads CPU time from /proc (Linux only).", file=sys.stderr)
        return 2
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(ALL_TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    targets.sort(key=ALL_TARGETS.index)
    conns = [int(c) for c in args.connections.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(_SIM_KNOBS):
        parser.error(f"unknown modes: {', '.join(sorted(set(modes) - set(_SIM_KNOBS)))}")
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    warmup = 0.5 if args.quick else 1.0

    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-bench-"))
    bodies = {m: workdir / f"body-{m}.json" for m in _SIM_KNOBS}
    for mode, path in bodies.items():
        path.write_bytes(chat_body(mode != "plain"))
    from proxy.sim.tokenizer import prompt_tokens

    sample = json.loads(bodies["plain"].read_bytes())
    info = {
        "messages": len(sample["messages"]),
        "bytes": len(bodies["plain"].read_bytes()),
        "sim_prompt_tokens": prompt_tokens(sample["messages"], add_generation_prompt=True),
    }
    print(f"body: {info['messages']} messages, {info['bytes']} bytes, "
          f"{info['sim_prompt_tokens']} sim tokens; {seconds:.0f} s a cell, wrk -t1, "
          f"{os.cpu_count()} CPUs")  # fmt: skip

    load = _load_average()
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} CPUs before the run; "
              "other processes will skew req/s and latency (CPU per request less so)")  # fmt: skip

    rows: list[Row] = []
    notes: dict[str, str] = {}
    servers: dict[str, Server | None] = {}
    sim = start_sim(workdir)
    started = time.monotonic()
    try:
        # All targets up at once (idle ones cost nothing), then every (mode, c) cell is
        # measured for each target back to back: drift on a shared box hits all alike.
        for name in targets:
            servers[name] = (
                None if name == "direct" else start_target(name, sim, workdir, args.baseline)
            )
        for name, server in servers.items():
            url = sim.url if server is None else server.url
            if name.startswith("trimproxy"):
                notes[name] = check_trimming(
                    url, bodies["plain"].read_bytes(), "trim" in target_flags(name)
                )
                print(f"{name}: {notes[name]}")
            for mode in modes:  # warm pools and caches on both paths
                pace_sim(sim, mode)
                run_wrk(url, bodies[mode], 16, warmup)
        for mode in modes:
            pace_sim(sim, mode)
            for c in conns:
                for name, server in servers.items():
                    url = sim.url if server is None else server.url
                    row = measure(server, sim, url, bodies[mode], mode, c, seconds)
                    rows.append(row)
                    print(f"  {mode:<7}c={c:<3} {name:<15}{row.rps:8.0f} req/s  "
                          f"p50 {row.p50_ms:7.2f} ms  CPU "
                          f"{_fmt(row.cpu_ms_per_req, '.3f')} ms/req", flush=True)  # fmt: skip
    except BenchError as exc:
        for name, server in servers.items():
            if server is not None and name.startswith("trimproxy"):
                print(f"--- {name} log (tail) ---\n{server.logs()[-3000:]}", file=sys.stderr)
        print(f"bench/overhead.py: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers.values():
            if server is not None:
                server.stop()
        sim.stop()
    elapsed = time.monotonic() - started

    add_ratios(rows)
    print()
    print_table(rows)
    print(f"\n{len(rows)} cells in {elapsed:.0f} s. CPU = utime+stime of the proxy process "
          f"per request; /floor compares with the bare FastAPI + aiohttp passthrough, /aio with "
          f"the bare aiohttp-server one.")  # fmt: skip

    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_before": load, **_versions()},
        "settings": {"seconds": seconds, "connections": conns, "modes": modes,
                     "targets": targets, "trim_budget": TRIM_BUDGET, "context": CONTEXT},
        "body": info,
        "notes": notes,
        "rows": [asdict(r) for r in rows],
    }  # fmt: skip
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
