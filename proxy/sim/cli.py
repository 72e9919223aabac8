"""Command-line flags of the sim, shared by ``python -m proxy.sim`` and
``trimproxy sim``.

Wire into another parser with ``add_arguments(subparser)`` and start with
``run_from_args(namespace)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from proxy.sim.config import TIMINGS, SimConfig

#: The line printed (and flushed) once the sim listens; tools that start it wait for it.
READY_PREFIX = "trimproxy-sim listening on "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SimConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="listen address [127.0.0.1]")
    add("--port", type=int, default=8000, help="listen port; 0 picks a free one [8000]")
    add(
        "--dialect",
        choices=("vllm", "fastchat"),
        default=defaults.dialect,
        help="whose wire format to speak [vllm]",
    )
    add("--model", default=defaults.model, help=f"served model name [{defaults.model}]")
    add(
        "--max-model-len",
        type=int,
        default=defaults.max_model_len,
        help=f"context window in sim tokens [{defaults.max_model_len}]",
    )
    add(
        "--tokens-per-second",
        type=float,
        default=defaults.tokens_per_second,
        help="generation speed; 0 answers at once [0]",
    )
    add(
        "--completion-tokens",
        type=int,
        default=defaults.completion_tokens,
        help=f"tokens each answer generates [{defaults.completion_tokens}]",
    )
    add(
        "--kv-blocks",
        type=int,
        default=defaults.kv_blocks,
        help=f"KV-cache blocks [{defaults.kv_blocks}]",
    )
    add(
        "--block-size",
        type=int,
        default=defaults.block_size,
        help=f"tokens per KV block [{defaults.block_size}]",
    )
    add(
        "--delay-seconds",
        type=float,
        default=defaults.delay_seconds,
        help="wait before the first byte of each answer [0]",
    )
    add(
        "--legacy-metrics",
        action="store_true",
        help="export vllm:gpu_cache_usage_perc (vLLM V0) instead of vllm:kv_cache_usage_perc",
    )
    add(
        "--error-style",
        choices=("current", "legacy"),
        default=defaults.error_style,
        help="vLLM error bodies: current {'error': {...}} or legacy flat [current]",
    )
    add("--strict-model", action="store_true", help="refuse other model names")
    add(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /_sim/* and /health",
    )
    add(
        "--config-json",
        metavar="JSON",
        help="any SimConfig fields as one JSON object; wins over the flags (for tools)",
    )
    add(
        "--prefill-tokens-per-second",
        type=float,
        default=defaults.prefill_tokens_per_second,
        help="prefill speed: uncached prompt tokens delay the first token; 0 = instant [0]",
    )
    add(
        "--decode-batch-slowdown",
        type=float,
        default=defaults.decode_batch_slowdown,
        help="fraction each other running sequence adds to the decode step [0]",
    )
    add(
        "--timing",
        choices=sorted(TIMINGS),
        help="a preset of --delay-seconds, --prefill-tokens-per-second, --tokens-per-second "
        "and --decode-batch-slowdown (gpu-7b: a 7-8B model on one GPU, a few times faster); "
        "wins over those flags",
    )
    add(
        "--no-prefix-caching",
        action="store_true",
        help="turn the prefix cache off (vLLM's --no-enable-prefix-caching)",
    )
    add(
        "--preempt",
        action="store_true",
        help="vLLM's admission: start on the prompt's blocks and preempt the newest "
        "sequence when the cache is full (default: reserve the whole length, never preempt)",
    )
    add(
        "--engines",
        type=int,
        default=1,
        help="independent engines in this process, on ports --port, --port+1, ... [1]",
    )
    add(
        "--record-limit",
        type=int,
        default=defaults.record_limit,
        help=f"requests kept for /_sim/requests [{defaults.record_limit}]",
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    fields: dict[str, Any] = dict(
        dialect=args.dialect,
        model=args.model,
        max_model_len=args.max_model_len,
        tokens_per_second=args.tokens_per_second,
        completion_tokens=args.completion_tokens,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        delay_seconds=args.delay_seconds,
        prefill_tokens_per_second=args.prefill_tokens_per_second,
        decode_batch_slowdown=args.decode_batch_slowdown,
        prefix_caching=not args.no_prefix_caching,
        preempt=args.preempt,
        legacy_metrics=args.legacy_metrics,
        error_style=args.error_style,
        strict_model=args.strict_model,
        record_limit=args.record_limit,
        api_key=args.api_key,
    )
    if args.timing:
        fields.update(TIMINGS[args.timing])
    if args.config_json:
        extra = json.loads(args.config_json)
        if not isinstance(extra, dict):
            raise ValueError("--config-json must be a JSON object")
        fields.update(extra)
    try:
        return SimConfig(**fields)
    except TypeError as exc:  # an unknown field name
        raise ValueError(str(exc)) from None


def _announce(url: str) -> None:
    print(f"{READY_PREFIX}{url}", flush=True)


def run_from_args(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        if args.engines < 1:
            raise ValueError("--engines must be at least 1")
    except ValueError as exc:
        print(f"trimproxy sim: {exc}", file=sys.stderr)
        return 2
    from proxy.sim.server import run  # aiohttp.web only once the sim really starts

    run(config, args.host, args.port, ready=_announce, engines=args.engines)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trimproxy sim",
        description="Simulated vLLM/FastChat OpenAI server with KV-cache accounting.",
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
