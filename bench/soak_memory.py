"""Memory soak: does anything a client controls make the proxy grow? (not a timed test)

Starts the sim (vLLM dialect, answers at once) and ``trimproxy serve`` with session
limits on, then sends mixed traffic for ``--minutes`` (10 by default) where every
request is new to the proxy: unique message content, a unique model name (up to a
few hundred bytes), a unique ``X-Session-ID``, trimmed and untrimmed bodies,
streams the client aborts after the first chunk, bad paths, and oversize bodies.
Every ``--interval`` seconds (10) the proxy's RSS (``VmRSS``) and open file
descriptors (``/proc/<pid>/fd``) are sampled.

It prints a table of the samples, the least-squares slope of the last half (RSS in
MiB/min, fds per min; flat is the goal), writes ``samples.json`` and a plot
(``soak_memory.png`` with matplotlib — the ``soak`` extra — else a hand-written
``soak_memory.svg``) to ``--out`` (``bench/results/soak_memory``).

    .venv/bin/python bench/soak_memory.py                 # 10 minutes
    .venv/bin/python bench/soak_memory.py --minutes 1 --interval 5   # smoke run

Linux only (``/proc``); installs nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "soak_memory"
SIM_READY = "trimproxy-sim listening on "  # proxy.sim.cli.READY_PREFIX


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    requests: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def start_sim(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = workdir / "sim.log"
    config = json.dumps({"max_model_len": 8192, "completion_tokens": 8, "record_limit": 50})
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.sim", "--port", "0", "--config-json", config],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env({}),
            cwd=workdir,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith(SIM_READY):
                return proc, line[len(SIM_READY) :].strip()
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the sim did not start:\n{log.read_text()}")


def start_proxy(workdir: Path, upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    settings = {
        "TRIMPROXY_UPSTREAM_URL": upstream,
        "TRIMPROXY_TOKENIZER": "approx",
        "TRIMPROXY_MAX_PROMPT_TOKENS": "1500",
        "TRIMPROXY_SESSION_MAX_TURNS": "6",
        "TRIMPROXY_SESSION_MAX_ENTRIES": "20000",
        "TRIMPROXY_MAX_BODY_BYTES": str(4 << 20),
        "TRIMPROXY_UPSTREAM_METRICS_INTERVAL": "5",
        "TRIMPROXY_LOG_LEVEL": "warning",
    }
    log = workdir / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(settings),
            cwd=workdir,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the proxy did not start:\n{log.read_text()}")


def sample(pid: int, t: float, requests: int) -> Sample:
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return Sample(round(t, 1), round(rss_kib / 1024, 2), fds, requests)


# -- traffic ----------------------------------------------------------------------


def _conversation(rng: random.Random, serial: int, turns: int) -> list[dict[str, str]]:
    words = [f"w{serial}x{rng.randrange(1 << 30):x}" for _ in range(40)]
    messages = [{"role": "system", "content": f"system {serial} " + " ".join(words[:5])}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"q{k} " + " ".join(rng.choices(words, k=60))})
        messages.append({"role": "assistant", "content": f"a{k} " + " ".join(words[:30])})
    messages.append({"role": "user", "content": f"last {serial} {rng.random()}"})
    return messages


async def one_request(client: httpx.AsyncClient, rng: random.Random, serial: int) -> str:
    kind = rng.choices(
        ["chat", "trimmed", "stream_abort", "stream", "bad_path", "oversize", "models"],
        weights=[30, 20, 15, 10, 10, 5, 10],
    )[0]
    model = f"model-{serial}-" + "m" * rng.randrange(0, 300)
    headers = {"x-session-id": f"s-{serial}-{rng.randrange(1 << 40):x}"}
    if kind == "bad_path":
        path = rng.choice(["/v1/../metrics", "/v1/%2e/chat/completions", f"/v1/x{serial}/../y"])
        body: dict[str, Any] = {"model": model, "messages": _conversation(rng, serial, 1)}
        response = await client.post(path, json=body, headers=headers)
        return f"{kind}:{response.status_code}"
    if kind == "models":
        response = await client.get("/v1/models")
        return f"{kind}:{response.status_code}"
    if kind == "oversize":
        content = "x" * (3 << 19)  # 1.5 MiB: refused by the cheap bound, not the size limit
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        return f"{kind}:{response.status_code}"
    turns = 30 if kind == "trimmed" else rng.randrange(0, 4)
    body = {"model": model, "messages": _conversation(rng, serial, turns), "max_tokens": 8}
    if kind.startswith("stream"):
        body["stream"] = True
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers
        ) as response:
            async for _chunk in response.aiter_raw():
                if kind == "stream_abort":
                    break  # leaving the block closes the connection mid-stream
            return f"{kind}:{response.status_code}"
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    return f"{kind}:{response.status_code}"


async def traffic(url: str, stop_at: float, concurrency: int, tally: Counter[str]) -> None:
    serial = 0

    async def worker(seed: int) -> None:
        nonlocal serial
        rng = random.Random(seed)
        limits = httpx.Limits(max_keepalive_connections=2)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            while time.monotonic() < stop_at:
                serial += 1
                try:
                    tally[await one_request(client, rng, serial)] += 1
                except httpx.HTTPError as exc:
                    tally[f"error:{type(exc).__name__}"] += 1

    await asyncio.gather(*(worker(seed) for seed in range(concurrency)))


async def run(
    url: str, pid: int, minutes: float, interval: float, concurrency: int
) -> tuple[list[Sample], Counter[str]]:
    tally: Counter[str] = Counter()
    start = time.monotonic()
    stop_at = start + minutes * 60
    samples = [sample(pid, 0.0, 0)]
    load = asyncio.create_task(traffic(url, stop_at, concurrency, tally))
    while time.monotonic() < stop_at:
        await asyncio.sleep(min(interval, max(0.0, stop_at - time.monotonic())))
        samples.append(sample(pid, time.monotonic() - start, sum(tally.values())))
        last = samples[-1]
        print(f"  t={last.t:6.0f}s rss={last.rss_mib:7.1f} MiB fds={last.fds:4d} "
              f"requests={last.requests}", flush=True)  # fmt: skip
    await load
    return samples, tally


# -- report -----------------------------------------------------------------------


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope, units per minute, of (seconds, value) points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60


def plot(samples: list[Sample], out: Path) -> Path:
    minutes = [s.t / 60 for s in samples]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg(samples, out / "soak_memory.svg")
    fig, rss_axis = plt.subplots(figsize=(8, 4))
    rss_axis.plot(minutes, [s.rss_mib for s in samples], color="tab:blue", label="RSS (MiB)")
    rss_axis.set_xlabel("minutes")
    rss_axis.set_ylabel("RSS (MiB)", color="tab:blue")
    rss_axis.set_ylim(bottom=0)
    fd_axis = rss_axis.twinx()
    fd_axis.plot(minutes, [s.fds for s in samples], color="tab:orange", label="open fds")
    fd_axis.set_ylabel("open fds", color="tab:orange")
    fd_axis.set_ylim(bottom=0)
    rss_axis.set_title("trimproxy under unique-key traffic")
    fig.tight_layout()
    path = out / "soak_memory.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _svg(samples: list[Sample], path: Path) -> Path:
    """Two polylines on a 0-based scale each, no dependencies."""
    width, height, pad = 640, 320, 40
    t_max = max(s.t for s in samples) or 1.0

    def line(values: list[float], color: str) -> str:
        top = max(values) * 1.1 or 1.0
        points = " ".join(
            f"{pad + s.t / t_max * (width - 2 * pad):.1f},"
            f"{height - pad - v / top * (height - 2 * pad):.1f}"
            for s, v in zip(samples, values, strict=True)
        )
        return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>'

    rss = [s.rss_mib for s in samples]
    fds = [float(s.fds) for s in samples]
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>'
        f"{line(rss, 'steelblue')}{line(fds, 'darkorange')}"
        f'<text x="{pad}" y="20" font-size="12">RSS (blue, max {max(rss):.0f} MiB) and open '
        f"fds (orange, max {max(fds):.0f}) over {t_max / 60:.1f} min, each from 0</text>"
        "</svg>"
    )
    path.write_text(svg)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="soak-memory-") as tmp:
        workdir = Path(tmp)
        sim, sim_url = start_sim(workdir)
        proxy, url = start_proxy(workdir, sim_url)
        try:
            print(f"soak: {args.minutes:g} min against {url} (pid {proxy.pid}), sim {sim_url}")
            samples, tally = asyncio.run(
                run(url, proxy.pid, args.minutes, args.interval, args.concurrency)
            )
        finally:
            for proc in (proxy, sim):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    half = [s for s in samples if s.t >= samples[-1].t / 2]
    rss_slope = slope_per_minute([(s.t, s.rss_mib) for s in half])
    fd_slope = slope_per_minute([(s.t, float(s.fds)) for s in half])
    picture = plot(samples, args.out)
    summary = {
        "minutes": args.minutes,
        "requests": sum(tally.values()),
        "answers": dict(sorted(tally.items())),
        "rss_mib_first": samples[0].rss_mib,
        "rss_mib_max": max(s.rss_mib for s in samples),
        "rss_mib_last": samples[-1].rss_mib,
        "rss_slope_last_half_mib_per_min": round(rss_slope, 3),
        "fds_max": max(s.fds for s in samples),
        "fd_slope_last_half_per_min": round(fd_slope, 3),
        "samples": [asdict(s) for s in samples],
    }
    (args.out / "samples.json").write_text(json.dumps(summary, indent=2))
    print(f"\nrequests: {summary['requests']}  answers: {summary['answers']}")
    print(f"RSS: start {samples[0].rss_mib:.1f} MiB, max {summary['rss_mib_max']:.1f}, "
          f"end {samples[-1].rss_mib:.1f}; fds max {summary['fds_max']}")  # fmt: skip
    print(f"slope of the last half: RSS {rss_slope:+.3f} MiB/min, fds {fd_slope:+.3f} /min")
    print(f"plot: {picture}   samples: {args.out / 'samples.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
