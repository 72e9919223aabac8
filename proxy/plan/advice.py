"""From a plan to the settings that make N sessions fit, and what to do when they don't.

* Each session may hold ``(usable_blocks // N) x block_size`` tokens (whole blocks; the
  null block is never handed out), so ``TRIMPROXY_MAX_PROMPT_TOKENS`` is that, capped
  at ``--max-model-len``, minus the completion reserve.
* ``TRIMPROXY_MAX_COMPLETION_TOKENS`` is the completion reserve too: the cap that holds
  every answer to the room the budget leaves it (a request without ``max_tokens`` would
  otherwise be let run to the context window), so the per-session arithmetic is a bound.
* ``TRIMPROXY_KV_ADMISSION``: a request of ``t`` tokens takes ``cdiv(t, block_size)``
  blocks, at most ``t / block_size + 1``; so a ledger of ``(usable_blocks - N) x
  block_size`` tokens never asks the engine for more blocks than it has with N requests
  in flight.
* ``fits``: the engine starts (one ``--max-model-len`` request fits) and every one of the
  N sessions gets a prompt budget at least as large as its completion reserve.
* Fallbacks, in the order operators take them, each recomputed: shorten ``max_tokens``
  / ``--max-model-len``; lower ``--gpu-memory-utilization`` by 0.05 when start-up fails
  on a tight card; fewer concurrent sequences; more or larger GPUs.
"""

from __future__ import annotations

import math
from typing import Any

from proxy.plan.capacity import GIB
from proxy.plan.kv import DTYPE_BYTES
from proxy.plan.planner import Plan, replan
from proxy.plan.worker import prefill_cost

__all__ = [
    "completion_cap",
    "engine_window",
    "fallbacks",
    "fastchat_advice",
    "fits",
    "prompt_budget",
    "proxy_window",
    "recommended",
    "setting_or_none",
]

#: The CUDA context and allocator slack of a transformers worker, per card.
FASTCHAT_OVERHEAD = GIB


def session_tokens(plan: Plan, sessions: int) -> int:
    """Tokens of KV each of ``sessions`` concurrent sessions can hold."""
    cap = plan.capacity
    return min(cap.max_model_len, (cap.usable_blocks // sessions) * cap.block_size)


def prompt_budget(plan: Plan, sessions: int | None = None) -> int:
    """The largest prompt (tokens) that leaves room for the completion reserve."""
    return session_tokens(plan, sessions or plan.concurrency) - plan.inputs.completion_reserve


def fits(plan: Plan) -> bool:
    return plan.capacity.starts and prompt_budget(plan) >= plan.inputs.completion_reserve


def completion_cap(completion_reserve: int) -> int | None:
    """The cap on max_tokens: the reserve each session's budget leaves its answer
    (None for a reserve of 0, which no cap can be)."""
    return completion_reserve or None


def admission_capacity(plan: Plan) -> int:
    cap = plan.capacity
    return max(0, (cap.usable_blocks - plan.concurrency) * cap.block_size)


def setting_or_none(value: int | None) -> int | None:
    """A token count ``trimproxy serve`` takes (at least 1), else None: not recommended,
    as serve would refuse it."""
    return value if value is not None and value >= 1 else None


def engine_window(plan: Plan) -> int:
    """The ``--max-model-len`` to run vLLM with: the plan's, or, when one request of
    that length does not fit, the longest that does (vLLM refuses to start then)."""
    cap = plan.capacity
    shrink = not cap.starts and cap.usable_blocks > 0
    return cap.usable_blocks * cap.block_size if shrink else cap.max_model_len


def proxy_window(window: int, completion_reserve: int) -> int | None:
    """``TRIMPROXY_CONTEXT_WINDOW``, unless the reserve fills it: serve refuses a window
    that leaves a prompt no room (``window - reserve - 1 < 1``)."""
    return window if window - completion_reserve - 1 >= 1 else None


def _vllm_args(plan: Plan) -> list[str]:
    inputs, cap = plan.inputs, plan.capacity
    if cap.usable_blocks < 1:
        return []  # no flag starts vLLM on these cards: nothing is left for the KV cache
    max_len = engine_window(plan)
    args = ["--max-model-len", str(max_len), "--max-num-seqs", str(plan.concurrency)]
    if inputs.device == "cuda":
        args += ["--gpu-memory-utilization", f"{inputs.gpu_memory_utilization:g}"]
    args += ["--tensor-parallel-size", str(inputs.tensor_parallel_size)]
    if inputs.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(inputs.pipeline_parallel_size)]
    args += ["--block-size", str(cap.block_size)]
    if inputs.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", inputs.kv_cache_dtype]
    return args


def fastchat_advice(plan: Plan) -> dict[str, Any]:
    """FastChat ``model_worker`` on the same cards: layers spread, one cache per request."""
    inputs, config = plan.inputs, plan.config
    gpus = inputs.tensor_parallel_size * inputs.pipeline_parallel_size
    # FastChat's model_worker loads float16 on GPU and float32 on CPU, whatever the
    # checkpoint's dtype.
    dtype = "float32" if inputs.device == "cpu" else "float16"
    tokens = max(1, min(prompt_budget(plan), plan.capacity.max_model_len))
    cost = prefill_cost(config, tokens, inputs.attn_implementation, dtype)
    # accelerate spreads the layers evenly: the busiest card holds ceil(L / gpus) of them.
    share = math.ceil(config.num_layers / gpus) / config.num_layers
    if inputs.device == "cpu":
        free = (inputs.cpu_kv_cache_space_gib or 4) * GIB
        args = ["--device", "cpu"]
    else:
        loaded = plan.weights.total_bytes
        if not config.quant_bits:
            loaded = loaded * DTYPE_BYTES[dtype] // DTYPE_BYTES[config.dtype]
        per_card_weights = loaded // gpus
        free = inputs.gpu_memory_bytes - per_card_weights - FASTCHAT_OVERHEAD
        max_gpu = math.ceil(per_card_weights * 1.1 / GIB * 2) / 2
        # More than the card holds is no flag to give: the weights do not fit it.
        fitting = max_gpu * GIB <= inputs.gpu_memory_bytes and free > 0
        args = ["--num-gpus", str(gpus), "--max-gpu-memory", f"{max_gpu:g}GiB"] if fitting else []
    # The busiest card holds its layers' share of every cache; a prefill's scores, mask,
    # activations and logits are counted whole on it (the worst card: the last).
    per_request = int(cost.kv * share)
    transient = cost.transient
    limit = 0
    for k in range(1, plan.concurrency + 1):
        if k * (per_request + transient) <= free:
            limit = k
    if args:
        args += ["--limit-worker-concurrency", str(max(1, limit))]
    return {
        "attn_implementation": inputs.attn_implementation,
        "dtype": dtype,
        "prompt_tokens": tokens,
        "kv_bytes_per_request": cost.kv,
        "prefill_transient_bytes": cost.transient,
        "peak_bytes_worst": cost.peak(plan.concurrency),
        "peak_bytes_serial": cost.peak(plan.concurrency, 1),
        "free_bytes_per_card": int(free),
        "limit_worker_concurrency": limit,
        "fits": bool(args) and limit >= plan.concurrency,
        "fastchat_args": args,
    }


def recommended(plan: Plan) -> dict[str, Any]:
    reserve = plan.inputs.completion_reserve
    env: dict[str, Any] = {
        "TRIMPROXY_MAX_PROMPT_TOKENS": setting_or_none(prompt_budget(plan)),
        "TRIMPROXY_CONTEXT_WINDOW": proxy_window(engine_window(plan), reserve),
        "TRIMPROXY_DEFAULT_COMPLETION_RESERVE": reserve,
        "TRIMPROXY_MAX_COMPLETION_TOKENS": completion_cap(reserve),
        "TRIMPROXY_KV_ADMISSION": setting_or_none(admission_capacity(plan)),
    }
    if plan.inputs.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = plan.inputs.cpu_kv_cache_space_gib or 4
    fastchat = fastchat_advice(plan)
    return {**env, "vllm_args": _vllm_args(plan), "fastchat_args": fastchat["fastchat_args"]}


def _effect(plan: Plan) -> dict[str, Any]:
    cap = plan.capacity
    return {
        "kv_cache_tokens": cap.kv_cache_tokens,
        "max_concurrency_at_max_model_len": round(cap.max_concurrency_at_max_model_len, 2),
        "max_prompt_tokens": prompt_budget(plan),
        "fits": fits(plan),
    }


def fallbacks(plan: Plan) -> list[dict[str, Any]]:
    """The operator's order, each step with its effect computed on this plan."""
    inputs, cap, n = plan.inputs, plan.capacity, plan.concurrency
    steps: list[dict[str, Any]] = []
    per_session = (cap.usable_blocks // n) * cap.block_size
    if per_session >= 1:
        shorter = min(cap.max_model_len, per_session)
        steps.append(
            {
                "step": "shorten max_tokens / --max-model-len",
                "args": ["--max-model-len", str(shorter)],
                "effect": _effect(replan(plan, max_model_len=shorter)),
                "note": f"{n} sessions of {shorter} tokens fit in {cap.usable_blocks} blocks",
            }
        )
    if inputs.device == "cuda" and inputs.gpu_memory_utilization > 0.55:
        util = round(inputs.gpu_memory_utilization - 0.05, 2)
        steps.append(
            {
                "step": "lower --gpu-memory-utilization by 0.05 (only when start-up fails "
                "on a tight card: it shrinks the cache)",
                "args": ["--gpu-memory-utilization", f"{util:g}"],
                "effect": _effect(replan(plan, gpu_memory_utilization=util)),
            }
        )
    fewer = max(1, min(n, cap.usable_blocks // cap.blocks_per_request))
    steps.append(
        {
            "step": "fewer concurrent sequences",
            "args": ["--max-num-seqs", str(fewer)],
            "effect": _effect(replan(plan, concurrency=fewer)),
            "note": f"{fewer} sequences of --max-model-len {cap.max_model_len} fit whole",
        }
    )
    if inputs.device == "cuda":
        # The fewest more cards (doubling, up to 8) that fit, else the most tried.
        more = None
        tp = inputs.tensor_parallel_size * 2
        while tp * inputs.pipeline_parallel_size <= 8 and plan.config.num_attention_heads % tp == 0:
            more = replan(plan, tensor_parallel_size=tp)
            if fits(more):
                break
            tp *= 2
        if more is not None:
            steps.append(
                {
                    "step": "more GPUs",
                    "args": ["--tensor-parallel-size", str(more.inputs.tensor_parallel_size)],
                    "effect": _effect(more),
                }
            )
        if inputs.gpu_memory_bytes < 80 * GIB:
            steps.append(
                {
                    "step": "larger GPUs",
                    "args": ["--gpu-memory", "80GiB"],
                    "effect": _effect(replan(plan, gpu_memory_bytes=80 * GIB)),
                }
            )
    return steps


AVOID = [
    "turning the KV cache off (use_cache=False on a transformers worker) is a last resort: "
    "every new token recomputes the whole prompt",
    "raising --gpu-memory-utilization above 0.95: the profile run's activations and CUDA "
    "graphs need the rest",
]
