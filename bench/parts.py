"""Instructions of each part of a request, one part at a time, under callgrind.

``bench/callgrind_cost.py`` measures whole requests through a server. This one takes
the request apart: each part (``PARTS``) runs on ``bench/overhead.py``'s 20-message
body, in a process of its own, ``--small`` and then ``--large`` times under
``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0`` in both), and the difference of
the two totals, divided by the difference of the counts, is the part's instructions
a call: start-up, imports and the tokenizer's training are in both totals and cancel.
Caches are warm (one call before the counted ones), as on a conversation's history.

    .venv/bin/python bench/parts.py                         # ~10 min, every part
    .venv/bin/python bench/parts.py --parts trim,floor,body
    .venv/bin/python bench/parts.py --floor-ir 923265       # shares of a floor request

With ``--floor-ir`` (a ``floor`` request's instructions from ``callgrind_cost.py``),
each part is also printed as a share of it: what the goal of ``CPU <= 1.15x the
floor`` leaves the proxy is 0.15 of it, for everything it does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import overhead  # noqa: E402

#: name -> what one call does; the parts of an ``approx`` request, of a trimmed one
#: (its budget is ``overhead.TRIM_BUDGET``), and of an ``hf:`` count.
PARTS = {
    "parse": "parse_chat: orjson and the body checks",
    "loads": "orjson.loads of the body alone (what approx-fresh pays besides the count)",
    "approx": "ApproxCounter.count of the 20 messages (cache warm, their hashes known)",
    "approx-fresh": "loads, then ApproxCounter.count of strings just parsed, as a request "
    "counts them (cache warm, every hash computed anew): less loads, the count's own",
    "floor": "floor_over: the cheap floor a trimmed request checks first",
    "trim": "TrimPolicy and trim, budget TRIM_BUDGET",
    "body": "render: the trimmed body serialised",
    "hf-count": "HFCounter.count, whole (runs cache warm)",
    "hf-prepare": "to_conversation and _prepare: the messages as transformers hands them on",
    "hf-jinja": "TrackedTemplate.render_plain: Jinja's plain render (what vLLM runs)",
    "hf-render": "TrackedTemplate.render: the same, with each message's place noted",
    "hf-spans": "RunCounter.spans_sync: the text cut at added tokens, runs from the cache",
    "hf-attribute": "attribute: the pieces' tokens summed per message",
}
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _done(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (warm caches), without an event loop's cost."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise SystemExit("the part suspended: its cache was not warm")


def build(part: str, workdir: Path) -> Callable[[], object]:
    """The zero-argument call that does ``part`` once, everything it needs built."""
    import orjson

    from proxy.dialects.chat import parse_chat, render
    from proxy.floor import floor_over
    from proxy.tokens.approx import ApproxCounter
    from proxy.trimming import TrimPolicy, trim

    raw = overhead.chat_body(False)
    chat = parse_chat(raw)
    messages = chat.messages
    budget = overhead.TRIM_BUDGET
    if part == "parse":
        return lambda: parse_chat(raw)
    approx = ApproxCounter()
    count = _done(approx.count(messages))
    if part == "approx":
        return lambda: _done(approx.count(messages))
    if part == "loads":
        return lambda: orjson.loads(raw)
    if part == "approx-fresh":
        return lambda: _done(approx.count(orjson.loads(raw)["messages"]))
    if part == "floor":
        return lambda: floor_over(messages, ApproxCounter.max_token_chars, budget)
    if part == "trim":
        return lambda: trim(messages, count, TrimPolicy(budget=budget, target=0.6))
    if part == "body":
        kept = trim(messages, count, TrimPolicy(budget=budget)).kept
        return lambda: render(chat, kept, None)
    return _build_hf(part, workdir, messages)


def _build_hf(part: str, workdir: Path, messages: list[Any]) -> Callable[[], object]:
    from proxy.tokens.hf import HFCounter, load_tokenizer
    from proxy.tokens.hf.normalize import to_conversation
    from proxy.tokens.hf.render import attribute

    spec = str(overhead.hf_tokenizer(workdir))
    counter = HFCounter(load_tokenizer(spec), spec)
    counter.self_check()
    asyncio.run(counter.count(messages))  # fills the runs cache: _done never waits
    template = counter._template(None)
    conversation, _ = to_conversation(messages, template.format)
    prepared = counter._prepare(conversation)
    rendered = template.tracked.render(prepared, None)
    pieces = counter.runs.spans_sync(rendered.text)
    if part == "hf-count":
        return lambda: _done(counter.count(messages))
    if part == "hf-prepare":
        return lambda: counter._prepare(to_conversation(messages, template.format)[0])
    if part == "hf-jinja":
        if template.tracked.render_plain(prepared, None)[0] != rendered.text:
            raise SystemExit("the plain render differs from the tracked one")
        return lambda: template.tracked.render_plain(prepared, None)
    if part == "hf-render":
        return lambda: template.tracked.render(prepared, None)
    if part == "hf-spans":
        return lambda: counter.runs.spans_sync(rendered.text)
    if part == "hf-attribute":
        return lambda: attribute(pieces, rendered.bounds)
    raise SystemExit(f"no part {part!r}; the parts: {', '.join(PARTS)}")


def child(part: str, calls: int, workdir: Path) -> None:
    call = build(part, workdir)
    call()  # the warm-up call: caches filled, code paths specialised
    for _ in range(calls):
        call()


def instructions(part: str, calls: int, workdir: Path) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, __file__, "--child", part, "--calls", str(calls),
               "--workdir", str(workdir)]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{part} ({calls} calls) failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated [all]")
    parser.add_argument("--small", type=int, default=200, help="calls in the first run [200]")
    parser.add_argument("--large", type=int, default=2200, help="calls in the second [2200]")
    parser.add_argument("--floor-ir", type=float, default=None,
                        help="a floor request's instructions (callgrind_cost.py)")  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.calls, args.workdir)
        return 0
    if shutil.which("valgrind") is None:
        print("bench/parts.py needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"no part {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    workdir = Path(tempfile.mkdtemp(prefix="trimproxy-parts-"))
    try:
        for part in parts:
            small = instructions(part, args.small, workdir)
            large = instructions(part, args.large, workdir)
            per_call = (large - small) / (args.large - args.small)
            share = f"  {per_call / args.floor_ir:.3f} of a floor request" if args.floor_ir else ""
            print(f"{part:<14}{per_call:>12,.0f} Ir/call{share}   {PARTS[part]}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
