"""The CPU of the trim ladder: the prepare step of an agent's body that needs clearing,
against the same body that needs none.

One chat body as a coding agent sends it (a system prompt, one task, ``--rounds`` tool
rounds of a call and a ~600-byte output; 200 rounds is ~150 kB) goes through
``proxy.pipeline.prepare.prepare`` in this process (parse, count with ``approx``, the ladder,
the body rendered), ``--requests`` times after ``--warmup``, under two windows: one
that holds it whole (forwarded as it came) and one that the ladder must clear it into.
The process CPU time (``time.process_time``) per request of each (the least of
``--repeats`` alternating runs), and their ratio
(docs/architecture.md §6: each output is counted cleared once, every other item keeps
the count it had, so the ratio stays small).

A loaded machine moves CPU time by tens of percent; ``--callgrind`` counts instructions
instead (~1 % apart from run to run): the script runs itself under valgrind's callgrind
and dumps its own counters around each run (``callgrind_control -d``), so start-up and
warm-up are not counted, and prints Ir per request of each body.

    .venv/bin/python bench/ladder.py                        # a few seconds
    .venv/bin/python bench/ladder.py --rounds 400 --requests 200
    .venv/bin/python bench/ladder.py --callgrind            # a few minutes: Ir per request
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from starlette.datastructures import Headers  # noqa: E402

from proxy.app import settle_heap  # noqa: E402
from proxy.dependencies import Services  # noqa: E402
from proxy.dialects.chat import parse_chat  # noqa: E402
from proxy.ladder_step import CLEARED_TOOL_OUTPUTS  # noqa: E402
from proxy.logs import RequestFacts  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.pipeline.prepare import Prepared, prepare  # noqa: E402
from proxy.pipeline.table import builtin_dialects  # noqa: E402
from proxy.sessions.gate import build_sessions  # noqa: E402
from proxy.tokens import ApproxCounter  # noqa: E402
from proxy.upstream import ContextWindows, Upstream  # noqa: E402
from tests.support.inprocess import make_settings  # noqa: E402

_TEXT = (
    "def test_parser handles the empty input returns none raises value error when the "
    "token stream ends early assert result equals expected line column offset "
)


def _words() -> list[str]:
    return _TEXT.split()


def agent_body(rounds: int) -> dict[str, Any]:
    """A coding agent's chat body: system prompt, one task, ``rounds`` tool rounds."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix the failing parser tests in src/parser.py."},
    ]
    words = _words()
    for k in range(rounds):
        arguments = orjson.dumps({"cmd": f"pytest -k {k}"}).decode()
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "run", "arguments": arguments}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = " ".join(words[(k + j) % len(words)] for j in range(90))
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": f"{k}: {text}"})
    return {"model": "m", "messages": messages, "max_tokens": 256}


def _services(upstream: Upstream, window: int) -> Services:
    settings = make_settings("http://127.0.0.1:9", upstream_metrics_interval=0,
                             context_window=window)  # fmt: skip
    metrics = Metrics()
    return Services(
        settings=settings,
        metrics=metrics,
        upstream=upstream,
        windows=ContextWindows(upstream, settings),
        counter=ApproxCounter(),
        sessions=build_sessions(settings, metrics),
    )


async def _one(svc: Services, raw: bytes) -> Prepared:
    chat = next(d for d in builtin_dialects() if d.endpoint == "chat")
    return await prepare(chat, parse_chat(raw), raw, Headers(raw=[]), svc, RequestFacts("b"))


#: What a run costs: called before it, it answers the function that reads the cost
#: after it (CPU seconds, or instructions under callgrind).
Meter = Callable[[], Callable[[], float]]


def cpu_time() -> Callable[[], float]:
    began = time.process_time()
    return lambda: time.process_time() - began


def callgrind(out: str) -> Meter:
    """Instructions, from this process's own counters (it runs under callgrind, its
    parts written to ``out.<pid>.<n>``): a dump before a run zeroes them, the one after
    holds the run, all but the tail and head of the two ``callgrind_control`` calls."""
    pid = str(os.getpid())

    def dump() -> None:
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)

    def read() -> float:
        dump()
        parts = glob.glob(f"{out}.{pid}.*")
        newest = max(parts, key=lambda p: int(p.rsplit(".", 1)[1]))
        text = Path(newest).read_text(errors="replace")
        total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        if total is None:
            raise SystemExit(f"no totals in {newest}")
        return float(total.group(1))

    def start() -> Callable[[], float]:
        dump()
        return read

    return start


async def _per_request(
    svc: Services, raw: bytes, requests: int, meter: Meter
) -> tuple[float, Prepared]:
    stop = meter()
    for _ in range(requests):
        last = await _one(svc, raw)
    return stop() / requests, last


async def measure(
    rounds: int, requests: int, warmup: int, repeats: int = 5, meter: Meter = cpu_time
) -> dict[str, Any]:
    """Both bodies' cost per request (``meter``'s: CPU seconds by default), the least of
    ``repeats`` alternating runs of each (a shared machine's load falls on both alike,
    and the least is the least disturbed)."""
    body = agent_body(rounds)
    raw = orjson.dumps(body)
    upstream = Upstream(make_settings("http://127.0.0.1:9"))
    try:
        whole = _services(upstream, 10_000_000)
        needs = await _one(whole, raw)
        tight = _services(upstream, needs.received_tokens // 2)
        for svc in (whole, tight):
            for _ in range(warmup):
                await _one(svc, raw)
        plains, clears = [], []
        for _ in range(repeats):
            plain, plain_p = await _per_request(whole, raw, requests, meter)
            cleared, cleared_p = await _per_request(tight, raw, requests, meter)
            plains.append(plain)
            clears.append(cleared)
    finally:
        await upstream.aclose()
    return {
        "bytes": len(raw),
        "received": plain_p.received_tokens,
        "forwarded": cleared_p.forwarded_tokens,
        "budget": cleared_p.budget,
        "outputs_cleared": int(cleared_p.headers.get(CLEARED_TOOL_OUTPUTS, "0")),
        "whole": min(plains),
        "cleared": min(clears),
        "ratio": min(clears) / min(plains),
        "forwarded_whole": plain_p.body is raw,
    }


def _under_callgrind(args: argparse.Namespace) -> int:
    """This script again, under callgrind, its counters dumped around each run."""
    with tempfile.TemporaryDirectory(prefix="ladder-callgrind-") as tmp:
        out = os.path.join(tmp, "ladder")
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
            f"--log-file={out}.log",
            sys.executable, __file__, f"--rounds={args.rounds}",
            f"--requests={args.requests}", f"--warmup={args.warmup}",
            f"--repeats={args.repeats}", f"--callgrind-out={out}",
        ]  # fmt: skip
        return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--requests", type=int, default=None, help="a run [100; 30 callgrind]")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=None, help="[5; 1 under callgrind]")
    parser.add_argument("--callgrind", action="store_true", help="Ir per request, not CPU")
    parser.add_argument("--callgrind-out", help=argparse.SUPPRESS)  # the run under valgrind
    args = parser.parse_args(argv)
    counting = args.callgrind or args.callgrind_out is not None
    if args.requests is None:
        args.requests = 30 if counting else 100
    if args.repeats is None:
        args.repeats = 1 if counting else 5
    if args.callgrind:
        return _under_callgrind(args)
    settle_heap()  # the heap as the serving process settles it (proxy.app)
    meter = cpu_time if args.callgrind_out is None else callgrind(args.callgrind_out)
    r = asyncio.run(measure(args.rounds, args.requests, args.warmup, args.repeats, meter))
    print(f"agent body: {args.rounds} rounds, {r['bytes'] / 1024:.0f} kB, {r['received']} tokens")
    whole, cleared = (
        (f"{r['whole'] * 1000:.3f} ms CPU", f"{r['cleared'] * 1000:.3f} ms CPU")
        if args.callgrind_out is None
        else (f"{r['whole']:,.0f} Ir", f"{r['cleared']:,.0f} Ir")
    )
    print(f"whole:   {whole} a request (forwarded as it came: {r['forwarded_whole']})")
    print(f"cleared: {cleared} a request ({r['outputs_cleared']} outputs cleared, "
          f"{r['forwarded']} tokens forwarded, budget {r['budget']})")  # fmt: skip
    print(f"ratio cleared/whole: {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
