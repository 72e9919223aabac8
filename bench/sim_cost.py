"""The sim's own cost: requests per CPU second of the sim process, this tree's sim
against another revision's (the main branch's by default), side by side in one run.

Each sim runs as its own ``python -m proxy.sim`` child (the other revision's
``proxy/sim`` exported with ``git archive`` into a temporary folder); rounds alternate
between them, and each round sends the same multi-turn conversations (20 messages,
~2k tokens at the end) at a fixed concurrency. The figure is requests over the
child's user+system CPU seconds (``/proc/PID/stat``), so the load of the rest of the
machine does not move it much; the ratio is what to read.

    .venv/bin/python bench/sim_cost.py                    # main vs this tree
    .venv/bin/python bench/sim_cost.py --base HEAD~3 --rounds 5 --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
READY = "trimproxy-sim listening on "


def export_sim(revision: str, into: Path) -> Path:
    """``proxy/`` of ``revision`` (the sim and the package marker) under ``into``."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "proxy/__init__.py", "proxy/sim"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as archive:
        archive.extractall(into, filter="data")
    return into


def start(tree: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = subprocess.Popen(
        [sys.executable, "-m", "proxy.sim", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tree,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(READY):
            return child, line[len(READY) :].strip()
    raise SystemExit(f"the sim of {tree} did not start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bodies(requests: int) -> list[dict[str, object]]:
    """Conversations of ten turns: 1, 3, ... 19 messages then the next question."""
    out: list[dict[str, object]] = []
    conversation = 0
    while len(out) < requests:
        messages: list[dict[str, str]] = [{"role": "system", "content": "Be brief. " * 20}]
        for turn in range(10):
            text = " ".join(f"c{conversation}t{turn}w{j}" for j in range(80))
            messages.append({"role": "user", "content": text})
            out.append({"model": "sim-model", "messages": list(messages)})
            messages.append({"role": "assistant", "content": "Hello from the simulated upstream."})
        conversation += 1
    return out[:requests]


async def drive(url: str, payloads: list[dict[str, object]], concurrency: int) -> None:
    queue = list(reversed(payloads))
    async with aiohttp.ClientSession() as http:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the revision to compare with [main]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="per round and sim [300]")
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    args = parser.parse_args()
    payloads = bodies(args.requests)
    with tempfile.TemporaryDirectory(prefix="sim-cost-") as tmp:
        trees = {args.base: export_sim(args.base, Path(tmp)), "this tree": ROOT}
        sims = {name: start(tree) for name, tree in trees.items()}
        try:
            for _, url in sims.values():  # warm both: imports, first allocations
                asyncio.run(drive(url, payloads[:50], args.concurrency))
            spent = dict.fromkeys(sims, 0.0)
            for _ in range(args.rounds):
                for name, (child, url) in sims.items():
                    before = cpu_seconds(child.pid)
                    asyncio.run(drive(url, payloads, args.concurrency))
                    spent[name] += cpu_seconds(child.pid) - before
        finally:
            for child, _ in sims.values():
                child.terminate()
                child.wait(timeout=10)
    total = args.rounds * args.requests
    rates = {name: total / seconds for name, seconds in spent.items()}
    for name, rate in rates.items():
        print(f"{name:>10}: {rate:8.0f} requests per CPU second ({spent[name]:.2f} s)")
    print(f"ratio this tree / {args.base}: {rates['this tree'] / rates[args.base]:.2f}")


if __name__ == "__main__":
    main()
