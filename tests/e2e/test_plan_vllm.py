"""``trimproxy plan --device cpu`` against the real vLLM CPU engine: the same KV cache size.

For four tiny Llamas (multi-head, grouped-query, multi-query, and grouped-query with
more layers and a ``--max-model-len`` that is not a whole number of blocks), the plan's
``kv_cache_tokens`` and ``num_blocks`` must equal what the engine itself reports: its
start-up log line "KV cache size: N tokens" and the ``kv_cache_size_tokens`` /
``num_gpu_blocks`` labels of ``vllm:cache_config_info``. One engine start per shape
(about half a minute each on two cores).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.plan.engine import parse_cache_config
from tests.support.tiny_model import ModelShape
from tests.support.vllm_stack import VllmStack, build_vllm_model

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 32
SPACE_GIB = 1
_ROOT = Path(__file__).resolve().parents[2]
_LOG_LINE = re.compile(r"KV cache size: ([0-9,]+) tokens")

SHAPES = {
    # 2 layers x 2 KV heads x (64 + 64) x 2 B = 1,024 B per token.
    "mha": (ModelShape(layers=2, hidden=128, heads=2, kv_heads=2, head_dim=64), None),
    # 2 layers x 2 KV heads (of 4) x 128 x 2 B = 1,024 B per token.
    "gqa": (ModelShape(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=64), None),
    # The stack's default model: 2 layers x 1 KV head (of 2) x 128 x 2 B = 512 B.
    "mqa": (ModelShape(), None),
    # Grouped-query: 6 layers x 2 KV heads (of 4; a plan that counted the query heads
    # would say twice as much) x 128 x 2 B = 3,072 B per token; 1,000 tokens is 31.25
    # blocks, so vLLM's float expression int(blocks / 32 x 1000) is checked too.
    "more-layers": (ModelShape(layers=6, hidden=128, heads=4, kv_heads=2, head_dim=64), 1000),
}


def _run(*args: str) -> dict[str, Any]:
    """``trimproxy plan ARGS`` as a process; its JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    argv = [sys.executable, "-m", "proxy.cli", "plan", *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=_ROOT, env=env)
    # 1 says only that the default sessions do not fit; the sizes are what is checked.
    assert out.returncode in (0, 1), out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _plan(model_dir: Path, max_model_len: int | None) -> dict[str, Any]:
    argv = [
        str(model_dir), "--device", "cpu", "--cpu-kv-cache-space", str(SPACE_GIB),
        "--block-size", str(BLOCK_SIZE), "--json",
    ]  # fmt: skip
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    return _run(*argv)


@pytest.mark.parametrize("name", list(SHAPES))
def test_plan_predicts_the_engines_kv_cache_size(name: str) -> None:
    if os.environ.get("TRIMPROXY_SKIP_VLLM") == "1":
        pytest.skip("TRIMPROXY_SKIP_VLLM=1: the real vLLM engine is switched off")
    shape, max_model_len = SHAPES[name]
    model_dir = build_vllm_model(shape)
    plan = _plan(model_dir, max_model_len)
    assert plan["exact"] is True
    with VllmStack(
        model_dir,
        kv_blocks=None,
        block_size=BLOCK_SIZE,
        kv_cache_space_gib=SPACE_GIB,
        max_model_len=max_model_len,
    ) as stack:
        labels = parse_cache_config(stack.metrics_text())
        log = stack.log_text()
        live = _run("--from-engine", stack.base_url, "--json")
    logged = _LOG_LINE.findall(log)
    assert logged, f"no 'KV cache size' line in the engine's log:\n{log[-4000:]}"
    assert int(logged[-1].replace(",", "")) == plan["kv_cache_tokens"]
    assert int(labels["kv_cache_size_tokens"]) == plan["kv_cache_tokens"]
    assert int(labels["num_gpu_blocks"]) == plan["num_blocks"]
    assert int(labels["block_size"]) == plan["block_size"] == BLOCK_SIZE
    # --from-engine reads the same figures back from the live engine.
    assert (live["kv_cache_tokens"], live["num_blocks"]) == (
        plan["kv_cache_tokens"],
        plan["num_blocks"],
    )
    assert live["max_model_len"] == (max_model_len or shape.max_position)
    print(
        f"\n{name}: plan {plan['kv_cache_tokens']:,} tokens / {plan['num_blocks']:,} blocks; "
        f"engine {labels['kv_cache_size_tokens']} tokens / {labels['num_gpu_blocks']} blocks"
    )
