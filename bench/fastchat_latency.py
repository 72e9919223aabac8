"""Per-request latency through trimproxy vs straight to FastChat (tiny model, CPU).

Starts a FastChat stack and a trimproxy process (as the e2e tests do), builds a fixed
multi-turn conversation under the budget (so both paths forward the same prompt), then
sends it alternately straight to FastChat and through the proxy, interleaved so that
drift on a busy 2-core machine hits both alike. Prints the start-up timings and, per
mode (non-streaming total, streaming time to first chunk and total), the median and
p90 of both paths, the ratio of the medians and the proxy's added milliseconds.

    .venv/bin/python bench/fastchat_latency.py [--repeats 40] [--tokenizer hf|approx]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.support.fastchat_stack import FastChatStack  # noqa: E402
from tests.support.processes import ProxyProcess  # noqa: E402
from tests.support.tiny_model import MAX_POSITIONS  # noqa: E402


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a terse assistant."}]
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * 12})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "fine, " * 10})
    messages.append({"role": "user", "content": "And now the last question?"})
    return messages


def timed_plain(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    began = time.perf_counter()
    response = client.post(url, json=body)
    response.raise_for_status()
    total = time.perf_counter() - began
    return total, total


def timed_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    began = time.perf_counter()
    first = 0.0
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:") and not first:
                first = time.perf_counter() - began
    return first, time.perf_counter() - began


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=40, help="requests per path and mode")
    parser.add_argument("--turns", type=int, default=8, help="turns in the conversation")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tokenizer", choices=("hf", "approx"), default="hf")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    began = time.monotonic()
    with FastChatStack() as stack:
        stack_seconds = time.monotonic() - began
        tokenizer = f"hf:{stack.model_dir}" if args.tokenizer == "hf" else "approx"
        began = time.monotonic()
        with ProxyProcess(
            {
                "UPSTREAM_URL": stack.base_url,
                "TOKENIZER": tokenizer,
                "CONTEXT_WINDOW": MAX_POSITIONS,
            }
        ) as proxy:
            proxy_seconds = time.monotonic() - began
            body = {
                "model": stack.model,
                "messages": conversation(args.turns),
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            paths = {
                "direct": f"{stack.api_base}/chat/completions",
                "proxy": f"{proxy.api_base}/chat/completions",
            }
            modes: dict[str, Callable[[httpx.Client, str, dict[str, Any]], tuple[float, float]]]
            modes = {"plain": timed_plain, "stream": timed_stream}
            samples: dict[str, dict[str, list[float]]] = {
                f"{mode}/{part}": {path: [] for path in paths}
                for mode in modes
                for part in (("total",) if mode == "plain" else ("first_chunk", "total"))
            }
            with httpx.Client(timeout=120) as client:
                for mode, run in modes.items():
                    for url in paths.values():  # warm-up: connections, caches
                        run(client, url, body)
                    for _ in range(args.repeats):
                        for path, url in paths.items():
                            first, total = run(client, url, body)
                            if mode == "plain":
                                samples["plain/total"][path].append(total)
                            else:
                                samples["stream/first_chunk"][path].append(first)
                                samples["stream/total"][path].append(total)
                prompt = client.post(paths["proxy"], json=body).headers.get(
                    "x-trimproxy-prompt-tokens"
                )

    report: dict[str, Any] = {
        "startup_s": {
            "venv": round(stack.timings.venv, 2),
            "model": round(stack.timings.model, 2),
            "fastchat_ready": round(stack.timings.ready, 2),
            "first_completion": round(stack.timings.first_completion, 2),
            "fastchat_stack_total": round(stack_seconds, 2),
            "proxy_ready": round(proxy_seconds, 2),
        },
        "prompt_tokens": prompt,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "tokenizer": args.tokenizer,
        "latency": {},
    }
    for name, by_path in samples.items():
        direct, via = summary(by_path["direct"]), summary(by_path["proxy"])
        report["latency"][name] = {
            "direct": direct,
            "proxy": via,
            "ratio": via["median_ms"] / direct["median_ms"],
            "added_ms": via["median_ms"] - direct["median_ms"],
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"start-up: {report['startup_s']}")
    print(
        f"prompt {prompt} tokens, max_tokens {args.max_tokens}, {args.repeats} requests "
        f"per path and mode, tokenizer {args.tokenizer}"
    )
    print(f"{'mode':<20}{'direct med/p90 ms':>22}{'proxy med/p90 ms':>22}{'ratio':>8}{'added':>10}")
    for name, row in report["latency"].items():
        direct, via = row["direct"], row["proxy"]
        print(
            f"{name:<20}{direct['median_ms']:>10.1f} /{direct['p90_ms']:>8.1f}"
            f"{via['median_ms']:>12.1f} /{via['p90_ms']:>8.1f}"
            f"{row['ratio']:>8.2f}{row['added_ms']:>9.1f}ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
