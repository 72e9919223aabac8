"""``trimproxy soak``: its flags and what the command does with them."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from proxy.soak.options import SoakOptions

INSTALL_HINT = (
    "trimproxy soak draws its progress and report with rich and matplotlib, the optional "
    "extra 'soak': pip install 'trimproxy[soak]' (in a checkout: pip install -e '.[soak]')"
)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("give a fraction of the KV cache: 0.9 means 90 %")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``soak`` to the ``trimproxy`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "soak",
        help="multi-turn load test that records the engine's KV-cache curve",
        description=(
            "Run seeded multi-turn conversations against --target (usually the proxy) and, "
            "with --compare, the same load against a second URL (usually the engine itself), "
            "arm after arm, sampling the engine's /metrics every 0.5 s. Writes "
            "requests.jsonl, samples.jsonl, summary.json, report.html and report.png into "
            "--out. Exit 1 when the target arm had errors or its KV usage peaked over "
            "--max-kv-usage."
        ),
    )
    add = parser.add_argument
    add("--target", required=True, metavar="URL", help="the server under test (the proxy)")
    add("--compare", metavar="URL", help="run the same load against this URL too (the engine)")
    add("--model", required=True, metavar="NAME", help="model name to send")
    add("--conversations", type=_positive, default=8, help="conversations at once [8]")
    add("--turn-tokens", type=_positive, default=200, help="user text per turn, tokens [200]")
    add("--max-tokens", type=_positive, default=64, help="max_tokens of each answer [64]")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, help="seconds per arm [600]")
    bound.add_argument("--turns", type=_positive, help="requests per conversation, instead")
    add(
        "--metrics-url",
        metavar="URL",
        help="the engine's /metrics [the --compare URL's; else the upstream the proxy's "
        "/readyz names]; 'none' for an engine without one (FastChat)",
    )
    add(
        "--engine-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="one engine's /metrics; give it once per engine behind the proxy [every engine "
        "the proxy's /readyz names]",
    )
    add("--session-header", default="X-Session-ID", help="session id header [X-Session-ID]")
    add("--out", type=Path, metavar="DIR", help="output folder [soak-<timestamp>]")
    add("--max-kv-usage", type=_fraction, metavar="X", help="fail when the KV peak exceeds X")
    add("--seed", type=int, default=0, help="seed of the conversations' text [0]")
    add("--api-key", metavar="KEY", help="bearer key for both URLs")
    return parser


def options_from(args: argparse.Namespace) -> SoakOptions:
    duration = args.duration if args.duration is not None or args.turns else 600.0
    return SoakOptions(
        target=args.target,
        compare=args.compare,
        model=args.model,
        conversations=args.conversations,
        turn_tokens=args.turn_tokens,
        max_tokens=args.max_tokens,
        duration=None if args.turns else duration,
        turns=args.turns,
        metrics_url=args.metrics_url,
        engine_metrics=tuple(args.engine_metrics),
        session_header=args.session_header,
        out=args.out or Path(time.strftime("soak-%Y%m%d-%H%M%S")),
        max_kv_usage=args.max_kv_usage,
        seed=args.seed,
        api_key=args.api_key,
    )


def run(args: argparse.Namespace) -> int:
    try:
        from rich.console import Console

        from proxy.soak.progress import SoakProgress, summary_table
        from proxy.soak.report import write_report
    except ImportError as exc:
        print(f"trimproxy soak: {exc.name or exc} is missing. {INSTALL_HINT}", file=sys.stderr)
        return 2
    from proxy.soak.runner import SetupError, run_soak

    options = options_from(args)
    console = Console(stderr=True)
    try:
        with SoakProgress(options, console) as progress:
            result = asyncio.run(run_soak(options, progress))
    except SetupError as exc:
        # Plain lines, never wrapped: the message names flags and URLs to copy.
        print(f"trimproxy soak: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"trimproxy soak: interrupted; what was measured is in {options.out}", file=sys.stderr
        )
        return 130
    write_report(
        options.out, result.summary, result.run, result.records, result.samples, result.reasons
    )
    console.print(summary_table(result.summary))
    for reason in result.reasons:
        print(f"trimproxy soak: FAIL: {reason}", file=sys.stderr)
    print(options.out)
    return 1 if result.reasons else 0
