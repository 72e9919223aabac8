"""KV admission on the real vLLM engine: preemptions, wall time and latency, with and without.

One vLLM engine (CPU build, 192 blocks x 32 = 6,144 KV tokens, ``--max-model-len 2048``)
serves the tiny model; trimproxy runs in front of it with a budget of 1,000 prompt tokens,
once with admission off and once per ``TRIMPROXY_KV_ADMISSION_FRACTION`` with ``auto``.
The load: ``--conversations`` multi-turn conversations at once, each ``--turns`` user
turns of ~``--user-words`` words, ``max_tokens`` 160 (``ignore_eos``: every answer is
160 tokens, so the runs are alike). Eight conversations at the budget need
8 x (1,000 + 160) = 9,280 tokens of KV: more than the cache, so vLLM preempts when
nothing else holds them back.

Reported per run: wall time of the whole load, p50/p99 latency per request, errors,
vLLM's ``vllm:num_preemptions_total`` during the run, and wall time as a ratio of
admission off. Runs alternate in a fixed order on one warm engine.

    .venv/bin/python bench/admission_vllm.py                    # ~5 min on 2 cores
    .venv/bin/python bench/admission_vllm.py --turns 6 --fractions 1.0,1.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

BUDGET = 1000
MAX_TOKENS = 160
MAX_MODEL_LEN = 2048
RESULTS = ROOT / "bench" / "results" / "admission_vllm.json"

_WORDS = (  # noqa: SIM905
    "the river runs past the old mill and the mountain road where people walk in the "
    "morning light while a small train carries coffee bread and apples to the city team "
    "project plan needs a clear answer about the token budget the model server memory"
).split()


@dataclass
class LoadResult:
    wall_s: float
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    waited: int = 0
    first_error: str = ""

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def user_message(conversation: int, turn: int, words: int) -> str:
    rng = random.Random(conversation * 1000 + turn)
    return f"c{conversation} t{turn}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


async def drive(
    base_url: str,
    model: str,
    *,
    conversations: int = 8,
    turns: int = 4,
    user_words: int = 220,
    max_tokens: int | None = MAX_TOKENS,
    headers: dict[str, str] | None = None,
    n: int = 1,
    stream: bool = False,
) -> LoadResult:
    """``conversations`` at once, each ``turns`` requests long, its history growing.

    ``max_tokens`` None sends none (with ``ignore_eos`` the answer runs to the context
    window); ``n`` asks for that many answers, the first one goes into the history.
    """
    result = LoadResult(wall_s=0.0)

    async def one(client: httpx.AsyncClient, c: int) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
        for turn in range(turns):
            messages.append({"role": "user", "content": user_message(c, turn, user_words)})
            body: dict[str, Any] = {
                "model": model,
                "messages": messages,
                "ignore_eos": True,
                "temperature": 0.0 if n == 1 else 0.8,
                "n": n,
                "stream": stream,
            }
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            began = time.perf_counter()
            if stream:
                response, reply = await _streamed(client, body)
            else:
                response = await client.post("/v1/chat/completions", json=body)
                reply = ""
                if response.status_code == 200:
                    reply = response.json()["choices"][0]["message"]["content"] or ""
            result.latencies_s.append(time.perf_counter() - began)
            result.statuses[response.status_code] = result.statuses.get(response.status_code, 0) + 1
            if "x-trimproxy-admission-wait-ms" in response.headers:
                result.waited += 1
            if response.status_code != 200 or reply is None:
                result.first_error = result.first_error or response.text[:300] or "cut stream"
                return
            messages.append({"role": "assistant", "content": reply})

    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600) as client:
        await asyncio.gather(*(one(client, c) for c in range(conversations)))
    result.wall_s = time.perf_counter() - began
    return result


async def _streamed(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[httpx.Response, str | None]:
    """A streamed request: the response and the first answer's text (None: cut short)."""
    parts: list[str] = []
    done = False
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response, ""
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    if choice.get("index") == 0:
                        parts.append(choice.get("delta", {}).get("content") or "")
    return response, "".join(parts) if done else None


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every process in a process group (vLLM's API server and engine
    core): what the engine spent, recompute after preemption included."""
    import os

    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5, pgrp
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    from tests.support.processes import ProxyProcess
    from tests.support.vllm_stack import VllmStack, build_vllm_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--user-words", type=int, default=220)
    parser.add_argument("--fractions", default="1.0,1.25,1.5")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant [1]")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    variants: list[tuple[str, dict[str, Any]]] = [("off", {})]
    variants += [
        (f"auto x{f:g}", {"kv_admission": "auto", "kv_admission_fraction": f}) for f in fractions
    ]
    rows: list[dict[str, Any]] = []
    with VllmStack(build_vllm_model(), max_model_len=MAX_MODEL_LEN) as engine:
        print(f"vLLM up in {engine.timings.ready:.0f} s; KV 192 x 32 = 6,144 tokens", flush=True)
        base = {
            "upstream_url": engine.base_url,
            "tokenizer": f"hf:{engine.model_dir}",
            "max_prompt_tokens": BUDGET,
            "upstream_metrics_interval": 0.5,
            "admission_timeout": 600,
            "log_level": "warning",
        }
        for _ in range(args.repeat):
            for name, settings in variants:
                with ProxyProcess(settings={**base, **settings}, startup_timeout=180) as proxy:
                    if settings:
                        _wait_capacity(proxy.url)
                    engine.wait_for_metrics(lambda m: m.running == 0 and m.waiting == 0, 120)
                    before = engine.metrics().preemptions
                    assert engine.proc is not None
                    cpu_before = group_cpu_seconds(engine.proc.pid)
                    load = asyncio.run(
                        drive(
                            proxy.url,
                            engine.model,
                            conversations=args.conversations,
                            turns=args.turns,
                            user_words=args.user_words,
                        )
                    )
                    preempted = engine.metrics().preemptions - before
                    engine_cpu = group_cpu_seconds(engine.proc.pid) - cpu_before
                rows.append(
                    {
                        "variant": name,
                        "wall_s": load.wall_s,
                        "p50_s": statistics.median(load.latencies_s),
                        "p99_s": load.pct(0.99),
                        "requests": len(load.latencies_s),
                        "errors": load.errors,
                        "waited": load.waited,
                        "preemptions": preempted,
                        "engine_cpu_s": engine_cpu,
                        "statuses": load.statuses,
                        "first_error": load.first_error,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    off = statistics.median(r["wall_s"] for r in rows if r["variant"] == "off")
    print(f"\n{args.conversations} conversations x {args.turns} turns, budget {BUDGET}, "
          f"max_tokens {MAX_TOKENS}, KV 6,144 tokens")  # fmt: skip
    print(f"{'variant':<10} {'wall s':>7} {'x off':>6} {'p50 s':>6} {'p99 s':>6} "
          f"{'errors':>6} {'waited':>6} {'preempt':>7} {'engine CPU s':>12}")  # fmt: skip
    for r in rows:
        print(f"{r['variant']:<10} {r['wall_s']:>7.1f} {r['wall_s'] / off:>6.2f} "
              f"{r['p50_s']:>6.2f} {r['p99_s']:>6.2f} {r['errors']:>6} {r['waited']:>6} "
              f"{r['preemptions']:>7.0f} {r['engine_cpu_s']:>12.1f}")  # fmt: skip
    print("\nmedians over the runs of each variant:")
    for name, _ in variants:
        mine = [r for r in rows if r["variant"] == name]
        wall = statistics.median(r["wall_s"] for r in mine)
        print(f"{name:<10} wall {wall:6.1f} s ({wall / off:.2f}x off), p50 "
              f"{statistics.median(r['p50_s'] for r in mine):.2f} s, p99 "
              f"{statistics.median(r['p99_s'] for r in mine):.2f} s, preemptions "
              f"{sum(r['preemptions'] for r in mine):.0f} in all, engine CPU "
              f"{statistics.median(r['engine_cpu_s'] for r in mine):.1f} s")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


def _wait_capacity(url: str, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line.startswith("trimproxy_kv_capacity_tokens ") and float(line.split()[1]) > 0:
                return float(line.split()[1])
        time.sleep(0.2)
    raise SystemExit("bench: the proxy never learned the engine's KV capacity (auto)")


if __name__ == "__main__":
    raise SystemExit(main())
