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

    .venv/bin/python bench/ladder.py                        # a few seconds
    .venv/bin/python bench/ladder.py --rounds 400 --requests 200
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
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


async def _per_request(svc: Services, raw: bytes, requests: int) -> tuple[float, Prepared]:
    began = time.process_time()
    for _ in range(requests):
        last = await _one(svc, raw)
    return (time.process_time() - began) / requests, last


async def measure(rounds: int, requests: int, warmup: int, repeats: int = 5) -> dict[str, Any]:
    """Both bodies' CPU per request, the least of ``repeats`` alternating runs of each
    (a shared machine's load falls on both alike, and the least is the least disturbed)."""
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
            plain, plain_p = await _per_request(whole, raw, requests)
            cleared, cleared_p = await _per_request(tight, raw, requests)
            plains.append(plain)
            clears.append(cleared)
    finally:
        await upstream.aclose()
    return {
        "bytes": len(raw),
        "received": plain_p.received_tokens,
        "forwarded": cleared_p.forwarded_tokens,
        "budget": cleared_p.budget,
        "cleared": int(cleared_p.headers.get(CLEARED_TOOL_OUTPUTS, "0")),
        "whole_ms": min(plains) * 1000,
        "cleared_ms": min(clears) * 1000,
        "ratio": min(clears) / min(plains),
        "forwarded_whole": plain_p.body is raw,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    settle_heap()  # the heap as the serving process settles it (proxy.app)
    r = asyncio.run(measure(args.rounds, args.requests, args.warmup, args.repeats))
    print(f"agent body: {args.rounds} rounds, {r['bytes'] / 1024:.0f} kB, {r['received']} tokens")
    whole = r["forwarded_whole"]
    print(f"whole:   {r['whole_ms']:.3f} ms CPU a request (forwarded as it came: {whole})")
    print(f"cleared: {r['cleared_ms']:.3f} ms CPU a request ({r['cleared']} outputs cleared, "
          f"{r['forwarded']} tokens forwarded, budget {r['budget']})")  # fmt: skip
    print(f"ratio cleared/whole: {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
