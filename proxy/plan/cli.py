"""``trimproxy plan``: the arithmetic before the first start, and the figures after it."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.plan.config import ConfigError, find_config, load_config
from proxy.plan.engine import fetch_engine
from proxy.plan.planner import PlanInputs, make_plan
from proxy.plan.report import engine_report, plan_report, render
from proxy.plan.worker import ATTENTION_IMPLEMENTATIONS

__all__ = ["NO_FIT", "add_parser", "parse_size", "run"]

#: The exit status of a plan whose sessions do not fit (a script can stop on it).
NO_FIT = 1

_UNITS = {"": 1 << 30, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6}
_UNITS |= {"mb": 10**6, "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30}
_UNITS |= {"t": 10**12, "tb": 10**12, "tib": 1 << 40}

DESCRIPTION = """\
KV cache arithmetic for a model: bytes per token from config.json (MHA, GQA, MQA,
ChatGLM groups, MLA, sliding window, fp8 KV), per GPU under tensor/pipeline
parallelism, weights from the checkpoint, the KV capacity and concurrency, and the
TRIMPROXY_* values and vLLM/FastChat flags that make --concurrency sessions fit.
--from-engine URL reads a running vLLM's own figures instead."""

EPILOG = """\
exit status: 0 when the sessions fit, 1 when they do not (the report says what to
change), 2 when the input cannot be read (one line on stderr names it)."""


def parse_size(text: str) -> int:
    """Bytes from "80GiB", "24GB", "512MiB" or a bare number of GiB."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 80GiB, 24GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _positive_size(text: str) -> int:
    size = parse_size(text)
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return size


def _at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``; argparse refuses anything
    else with one line, exit 2."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {least}")
        return value

    return parse


_positive = _at_least(1)
_not_negative = _at_least(0)


def _utilization(text: str) -> float:
    """A share of the card, as vLLM takes it: above 0, at most 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g}: must be above 0 and at most 1")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plan`` on the ``trimproxy`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="size the KV cache, the trim budget and the engine flags for a model",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("model", nargs="?", help="model directory or its config.json")
    _engine_arguments(parser)
    _flag_arguments(parser)
    _plan_arguments(parser)
    add("--json", action="store_true", help="one JSON object on stdout")
    return parser


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine: where its figures come from, and its GPUs."""
    add = parser.add_argument
    add(
        "--from-engine",
        metavar="URL",
        help="a running vLLM server's root URL: read its own KV figures instead of computing them",
    )
    add("--api-key", help="bearer token for --from-engine (default TRIMPROXY_UPSTREAM_API_KEY)")
    add(
        "--tensor-parallel-size",
        type=_positive,
        default=1,
        metavar="N",
        help="GPUs each layer is split over (vLLM's flag) [1]",
    )
    add(
        "--pipeline-parallel-size",
        type=_positive,
        default=1,
        metavar="N",
        help="stages the layers are spread over (vLLM's flag) [1]",
    )
    add(
        "--gpu-memory",
        type=_positive_size,
        default="80GiB",
        metavar="SIZE",
        help="memory of each GPU: 80GiB, 24GB, 512MiB, or a number of GiB [80GiB]",
    )
    add(
        "--gpu-memory-utilization",
        type=_utilization,
        default=0.9,
        metavar="SHARE",
        help="share of each GPU vLLM may use, above 0 and at most 1 [0.9]",
    )


def _flag_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's own flags that size its KV cache."""
    add = parser.add_argument
    add(
        "--max-model-len",
        type=_positive,
        metavar="N",
        help="the engine's context length (default: the config's)",
    )
    add(
        "--max-num-seqs",
        type=_positive,
        metavar="N",
        help="sequences vLLM runs at once (default: --concurrency, else 8)",
    )
    add(
        "--dtype",
        default="auto",
        help="the weights' dtype as vLLM's --dtype (auto: the config's torch_dtype) [auto]",
    )
    add(
        "--kv-cache-dtype",
        default="auto",
        help="the KV cache's dtype as vLLM's --kv-cache-dtype (fp8*: 1 byte) [auto]",
    )
    add(
        "--block-size",
        type=_positive,
        metavar="N",
        help="tokens per KV block (default: 16 on cuda, 128 on cpu)",
    )
    add("--device", choices=("cuda", "cpu"), default="cuda", help="where the engine runs [cuda]")
    add(
        "--cpu-kv-cache-space",
        type=_positive,
        metavar="GiB",
        help="with --device cpu: the KV pool, VLLM_CPU_KVCACHE_SPACE [4]",
    )


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What the plan must hold: the sessions at once, each answer's share, the reserve."""
    add = parser.add_argument
    add(
        "--concurrency",
        type=_positive,
        metavar="N",
        help="sessions that must fit at once (default: --max-num-seqs, else 8)",
    )
    add(
        "--completion-reserve",
        type=_not_negative,
        default=512,
        metavar="TOKENS",
        help="tokens kept for each answer (TRIMPROXY_DEFAULT_COMPLETION_RESERVE) [512]",
    )
    add(
        "--reserve",
        type=parse_size,
        metavar="SIZE",
        help="per-GPU activation/overhead reserve (default: an estimate, see docs/plan.md)",
    )
    add(
        "--attn-implementation",
        choices=ATTENTION_IMPLEMENTATIONS,
        default="eager",
        help="the transformers worker's attention, for FastChat advice [eager]",
    )


def _report(args: argparse.Namespace) -> dict[str, Any]:
    if args.from_engine:
        key = args.api_key or os.environ.get("TRIMPROXY_UPSTREAM_API_KEY") or None
        engine = fetch_engine(args.from_engine, key)
        sessions = args.concurrency or args.max_num_seqs or 8
        return engine_report(engine, sessions, args.completion_reserve)
    if not args.model:
        raise ConfigError("MODEL", "give a model directory or config.json, or --from-engine URL")
    path = Path(args.model)
    config = load_config(path)
    model_dir = find_config(path).parent
    plan = make_plan(
        PlanInputs(
            config=config,
            model_dir=model_dir,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            gpu_memory_bytes=args.gpu_memory,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            block_size=args.block_size,
            device=args.device,
            cpu_kv_cache_space_gib=args.cpu_kv_cache_space,
            concurrency=args.concurrency,
            completion_reserve=args.completion_reserve,
            reserve_bytes=args.reserve,
            attn_implementation=args.attn_implementation,
        )
    )
    window = plan.capacity.max_model_len
    if window - args.completion_reserve - 1 < 1:
        raise ConfigError(
            "--completion-reserve",
            f"{args.completion_reserve} leaves no room for a prompt in a context of {window} "
            f"tokens (trimproxy serve would refuse it): give at most {max(0, window - 2)}",
        )
    return plan_report(plan)


def run(args: argparse.Namespace) -> int:
    """Print the plan; exit 1 (``NO_FIT``) when the sessions do not fit, 2 with one line
    naming the field when the input cannot be read."""
    try:
        report = _report(args)
    except ConfigError as exc:
        print(f"trimproxy plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(render(report))
    return 0 if report["fits"] else NO_FIT
