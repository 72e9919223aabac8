"""``trimproxy plan``: the arithmetic before the first start, and the figures after it."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from proxy.plan.config import ConfigError, find_config, load_config
from proxy.plan.engine import fetch_engine
from proxy.plan.planner import PlanInputs, make_plan
from proxy.plan.report import engine_report, plan_report, render
from proxy.plan.worker import ATTENTION_IMPLEMENTATIONS

__all__ = ["add_parser", "parse_size", "run"]

_UNITS = {"": 1 << 30, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6}
_UNITS |= {"mb": 10**6, "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30}
_UNITS |= {"t": 10**12, "tb": 10**12, "tib": 1 << 40}

DESCRIPTION = """\
KV cache arithmetic for a model: bytes per token from config.json (MHA, GQA, MQA,
ChatGLM groups, MLA, sliding window, fp8 KV), per GPU under tensor/pipeline
parallelism, weights from the checkpoint, the KV capacity and concurrency, and the
TRIMPROXY_* values and vLLM/FastChat flags that make --concurrency sessions fit.
--from-engine URL reads a running vLLM's own figures instead."""


def parse_size(text: str) -> int:
    """Bytes from "80GiB", "24GB", "512MiB" or a bare number of GiB."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 80GiB, 24GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plan`` on the ``trimproxy`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="size the KV cache, the trim budget and the engine flags for a model",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", nargs="?", help="model directory or its config.json")
    parser.add_argument("--from-engine", metavar="URL", help="a running vLLM server's root URL")
    parser.add_argument(
        "--api-key", help="bearer token for --from-engine (default TRIMPROXY_UPSTREAM_API_KEY)"
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory", type=parse_size, default="80GiB", help="per GPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, help="default: the config's context")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--block-size", type=int, help="default: 16 on cuda, 128 on cpu")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--cpu-kv-cache-space", type=int, metavar="GiB", help="VLLM_CPU_KVCACHE_SPACE"
    )
    parser.add_argument("--concurrency", type=int, help="sessions that must fit at once")
    parser.add_argument(
        "--completion-reserve", type=int, default=512, help="tokens kept for each answer"
    )
    parser.add_argument(
        "--reserve",
        type=parse_size,
        help="per-GPU activation/overhead reserve (default: an estimate, see docs/plan.md)",
    )
    parser.add_argument(
        "--attn-implementation", choices=ATTENTION_IMPLEMENTATIONS, default="eager",
        help="the transformers worker's attention, for FastChat advice",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser


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
    return plan_report(plan)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 2 with one line naming the field when the input cannot be read."""
    try:
        report = _report(args)
    except ConfigError as exc:
        print(f"trimproxy plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(render(report))
    return 0
