"""Side by side: trimproxy's trimming, LiteLLM's and LangChain's ``trim_messages``.

Run from the repository root in the compare venv (bench/compare/setup.sh builds it):

    .cache/compare-venv/bin/python -m bench.compare            # full run
    .cache/compare-venv/bin/python -m bench.compare --quick    # smoke run

Three measurements, all judged by one shared token counter (see counting.py):

1. time per call at the reference budget, cold (empty count caches) and warm;
2. a budget sweep: every trimmer at every budget on every conversation shape,
   each output checked against the invariants of docs/architecture.md §6;
3. prefix reuse on a conversation that grows one turn per request.

Prints tables and writes everything (per-budget checks included) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.compare import conversations, counting
from bench.compare.report import report, targets
from bench.compare.run import ALL, REFERENCE_BUDGET, Config, run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer budgets, samples and turns")
    p.add_argument(
        "--counter", default="tiktoken:cl100k_base", help="tiktoken[:<encoding>] or approx"
    )
    p.add_argument("--trimmers", nargs="+", default=list(ALL), choices=ALL, metavar="NAME")
    p.add_argument(
        "--shapes", nargs="+", default=list(conversations.SHAPES), choices=conversations.SHAPES
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--budget", type=int, default=REFERENCE_BUDGET, help="budget of timing and reuse"
    )
    p.add_argument("--target", type=float, default=0.6, help="trimproxy's TRIM_TARGET")
    p.add_argument("--turns", type=int, help="turns of the growing conversation (200; quick 120)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--out", type=Path, default=counting.REPO / "bench" / "results" / "compare.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = Config(
        quick=args.quick,
        counter=args.counter,
        trimmers=tuple(args.trimmers),
        shapes=tuple(args.shapes),
        seed=args.seed,
        budget=args.budget,
        target=args.target,
        turns=args.turns,
        jobs=args.jobs,
    )
    command = "python -m bench.compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = run(cfg, command.strip())
    result["targets"] = targets(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(report(result))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
