"""How much KV one request with ``n`` answers holds on the real vLLM engine.

KV admission reserves ``prompt + n x completion allowance`` on the claim that vLLM
shares the prompt's blocks between the ``n`` answers. vLLM V1 runs ``n`` as ``n`` child
requests of one prompt (``vllm/v1/engine/parallel_sampling.py``); they share its blocks
through the prefix cache, so only the prompt's full blocks are shared: each child has
its own copy of the prompt's last, partly filled block. This measures it: one streamed
request per ``n`` (each with a fresh prompt, so nothing is in the prefix cache before),
``ignore_eos`` so every answer runs to ``max_tokens``, ``vllm:kv_cache_usage_perc``
sampled every 20 ms; the peak in blocks, next to the two models::

    shared   = floor(P / B) + n x ceil((P mod B + C) / B)
    unshared = n x ceil((P + C) / B)

once with the engine's default (prefix caching on) and once with
``--no-enable-prefix-caching``.

    .venv/bin/python bench/admission_sharing.py            # two engine starts, ~3 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from proxy.admission.need import Need  # noqa: E402

BLOCKS = 192
BLOCK = 32
_WORDS = ["river", "mill", "road", "light", "train", "coffee", "bread", "apples", "city", "plan"]


def prompt_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"{seed}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


async def peak_blocks(
    base: str, model: str, n: int, words: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    """One streamed request; the peak of KV blocks in use while it runs, sampled by a
    thread of its own (the event loop is busy reading the stream)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(seed, words)}],
        "max_tokens": max_tokens,
        "n": n,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    peak = {"kv": 0.0, "running": 0.0}
    done = threading.Event()
    usage: dict[str, Any] = {}

    def sample() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not done.is_set():
                for line in client.get("/metrics").text.splitlines():
                    if line.startswith("vllm:kv_cache_usage_perc{"):
                        peak["kv"] = max(peak["kv"], float(line.rsplit(" ", 1)[1]))
                    elif line.startswith("vllm:num_requests_running{"):
                        peak["running"] = max(peak["running"], float(line.rsplit(" ", 1)[1]))
                time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    async with (
        httpx.AsyncClient(base_url=base, timeout=600) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                usage = json.loads(line[6:]).get("usage") or usage
    done.set()
    sampler.join()
    prompt = int(usage["prompt_tokens"])
    completion = int(usage["completion_tokens"])
    per_answer = completion // n
    need = Need(prompt, per_answer, n)  # the proxy's own arithmetic
    shared = need.tokens(BLOCK, shares_prompt=True) // BLOCK
    unshared = need.tokens(BLOCK, shares_prompt=False) // BLOCK
    return {
        "n": n,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "peak_blocks": round(peak["kv"] * BLOCKS),
        "peak_running": peak["running"],
        "model_shared": shared,
        "model_unshared": unshared,
    }


def main(argv: list[str] | None = None) -> int:
    from tests.support.vllm_stack import VllmStack, build_vllm_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=700)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--n", default="1,2,4")
    args = parser.parse_args(argv)
    ns = [int(v) for v in args.n.split(",")]
    rows: list[dict[str, Any]] = []
    model_dir = build_vllm_model()
    for caching, extra in (("on", ()), ("off", ("--no-enable-prefix-caching",))):
        with VllmStack(model_dir, max_model_len=2048, extra_args=extra) as engine:
            info = [ln for ln in engine.metrics_text().splitlines() if "cache_config_info{" in ln]
            print(f"prefix caching {caching}: {info[0][:400] if info else 'no cache_config_info'}")
            for i, n in enumerate(ns):
                engine.wait_for_metrics(lambda m: m.running == 0 and m.kv_usage == 0, 60)
                seed = int(time.time()) * 10 + i
                before = engine.metrics().preemptions
                row = asyncio.run(
                    peak_blocks(engine.base_url, engine.model, n, args.words, args.max_tokens, seed)
                )
                row["preemptions"] = engine.metrics().preemptions - before
                row["prefix_caching"] = caching
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'caching':<8} {'n':>2} {'prompt':>6} {'answer':>6} {'peak':>5} "
          f"{'shared':>6} {'unshared':>8} {'preempted':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['prefix_caching']:<8} {r['n']:>2} {r['prompt_tokens']:>6} "
              f"{r['completion_tokens'] // r['n']:>6} {r['peak_blocks']:>5} "
              f"{r['model_shared']:>6} {r['model_unshared']:>8} "
              f"{r['preemptions']:>9.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
