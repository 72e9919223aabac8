"""The plan as one JSON object, and as a short table per GPU plus the advice."""

from __future__ import annotations

from typing import Any

from proxy.plan.advice import (
    AVOID,
    completion_cap,
    fallbacks,
    fastchat_advice,
    fits,
    prompt_budget,
    proxy_window,
    recommended,
    setting_or_none,
)
from proxy.plan.capacity import GIB, cdiv
from proxy.plan.engine import EngineFigures
from proxy.plan.planner import Plan

__all__ = ["engine_report", "plan_report", "render"]


def _gib(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


def _model_section(plan: Plan) -> dict[str, Any]:
    config = plan.config
    return {
        "source": config.source,
        "architecture": config.architecture,
        "model_type": config.model_type,
        "attention": config.attention,
        "layers": config.num_layers,
        "attention_heads": config.num_attention_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "v_head_dim": config.v_head_dim,
        "sliding_window": config.sliding_window,
        "sliding_layers": config.sliding_layers,
        "dtype": plan.dtype,
        "kv_cache_dtype": plan.kv_dtype,
    }


def _gpus_section(plan: Plan) -> list[dict[str, Any]]:
    return [
        {
            "index": row.card.index,
            "layers": [row.card.first_layer, row.card.last_layer],
            "kv_heads": row.card.kv_heads,
            "kv_bytes_per_token": row.card.kv_bytes_per_token,
            "weights_bytes": row.weights_bytes,
            "reserve_bytes": row.reserve_bytes,
            "kv_pool_bytes": row.pool_bytes,
            "bytes_per_block": row.bytes_per_block,
            "num_blocks": row.num_blocks,
        }
        for row in plan.capacity.cards
    ]


def _advice_section(plan: Plan) -> dict[str, Any]:
    return {
        "fits": fits(plan),
        "exact": plan.capacity.exact,
        "estimates": plan.estimates,
        "recommended": recommended(plan),
        "transformers_worker": fastchat_advice(plan),
        "fallbacks": fallbacks(plan),
        "avoid": AVOID,
    }


def plan_report(plan: Plan) -> dict[str, Any]:
    cap, inputs = plan.capacity, plan.inputs
    budget = prompt_budget(plan)
    at_budget = cap.num_blocks / cdiv(max(1, budget + inputs.completion_reserve), cap.block_size)
    return {
        "model": _model_section(plan),
        "device": inputs.device,
        "tensor_parallel_size": inputs.tensor_parallel_size,
        "pipeline_parallel_size": inputs.pipeline_parallel_size,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token_per_gpu,
        "weights": {
            "total_bytes": plan.weights.total_bytes,
            "source": plan.weights.source,
            "exact": plan.weights.exact,
        },
        "gpus": _gpus_section(plan),
        "kv_pool_source": cap.pool_source,
        "block_size": cap.block_size,
        "num_blocks": cap.num_blocks,
        "kv_cache_tokens": cap.kv_cache_tokens,
        "max_model_len": cap.max_model_len,
        "max_concurrency_at_max_model_len": cap.max_concurrency_at_max_model_len,
        "budget_tokens": budget + inputs.completion_reserve,
        "max_concurrency_at_budget": at_budget,
        "concurrency": plan.concurrency,
        "weights_fit": all(row.pool_bytes > 0 for row in cap.cards),
        "starts": cap.starts,
        **_advice_section(plan),
    }


def engine_report(engine: EngineFigures, sessions: int, completion_reserve: int) -> dict[str, Any]:
    """The same advice from a live engine's figures."""
    max_len = engine.max_model_len or engine.kv_cache_tokens
    usable = max(0, engine.num_gpu_blocks - 1)
    per_session = min(max_len, (usable // sessions) * engine.block_size)
    budget = per_session - completion_reserve
    per_request = cdiv(max_len, engine.block_size)
    fewer = max(1, usable // per_request)
    return {
        "engine": engine.url,
        "model": engine.model,
        "num_blocks": engine.num_gpu_blocks,
        "block_size": engine.block_size,
        "kv_cache_tokens": engine.kv_cache_tokens,
        "kv_cache_tokens_reported": engine.kv_cache_tokens_reported,
        "max_model_len": engine.max_model_len,
        "max_concurrency_at_max_model_len": engine.num_gpu_blocks / per_request,
        "concurrency": sessions,
        "fits": budget >= completion_reserve,
        "exact": True,
        "recommended": {
            "TRIMPROXY_MAX_PROMPT_TOKENS": setting_or_none(budget),
            "TRIMPROXY_CONTEXT_WINDOW": proxy_window(max_len, completion_reserve),
            "TRIMPROXY_DEFAULT_COMPLETION_RESERVE": completion_reserve,
            "TRIMPROXY_MAX_COMPLETION_TOKENS": completion_cap(completion_reserve),
            "TRIMPROXY_KV_ADMISSION": setting_or_none((usable - sessions) * engine.block_size),
            "vllm_args": ["--max-num-seqs", str(sessions)],
            "fastchat_args": [],
        },
        "fallbacks": [
            {
                "step": "shorten max_tokens / --max-model-len",
                "args": ["--max-model-len", str(max(1, per_session))],
            },
            {"step": "fewer concurrent sequences", "args": ["--max-num-seqs", str(fewer)]},
            {"step": "more or larger GPUs", "args": []},
        ],
        "avoid": AVOID,
    }


def _advice_lines(report: dict[str, Any]) -> list[str]:
    rec = report["recommended"]
    lines = [
        "",
        f"{report['concurrency']} sessions: {'fit' if report['fits'] else 'DO NOT FIT'}",
        "recommended:",
    ]
    for key, value in rec.items():
        if key.isupper() and value is not None:
            lines.append(f"  {key}={value}")
    planned = "gpus" in report  # a plan, not an engine's own figures
    if rec["vllm_args"]:
        lines.append(f"  vllm serve MODEL {' '.join(rec['vllm_args'])}")
    elif planned:
        lines.append("  vllm serve: no flags start it here: nothing is left for the KV cache")
    if rec["fastchat_args"]:
        lines.append(f"  python -m fastchat.serve.model_worker {' '.join(rec['fastchat_args'])}")
    elif planned and report["device"] == "cuda":
        lines.append("  fastchat model_worker: no flags: the weights do not fit the cards")
    lines.append("fallbacks, in order (when it does not fit):")
    for number, step in enumerate(report["fallbacks"], 1):
        effect = step.get("effect")
        tail = ""
        if effect:
            tail = (
                f" -> {effect['kv_cache_tokens']:,} KV tokens, "
                f"{effect['max_concurrency_at_max_model_len']}x at max-model-len, "
                f"prompt budget {effect['max_prompt_tokens']:,}"
                f"{'' if effect['fits'] else ' (still does not fit)'}"
            )
        lines.append(f"  {number}. {step['step']}: {' '.join(step['args'])}{tail}")
    lines.append("avoid:")
    lines.extend(f"  - {item}" for item in report["avoid"])
    return lines


def render(report: dict[str, Any]) -> str:
    """Plain text: a short table per GPU, the totals, the advice."""
    if "engine" in report:
        lines = [
            f"engine {report['engine']} ({report['model']}): {report['num_blocks']:,} blocks "
            f"of {report['block_size']} = {report['kv_cache_tokens']:,} KV tokens, "
            f"max-model-len {report['max_model_len']}, "
            f"{report['max_concurrency_at_max_model_len']:.2f}x at max-model-len",
        ]
        return "\n".join(lines + _advice_lines(report)) + "\n"
    model = report["model"]
    lines = [
        f"{model['architecture'] or model['model_type']}: {model['attention'].upper()}, "
        f"{model['layers']} layers, {model['kv_heads']} KV heads x {model['head_dim']}, "
        f"KV {model['kv_cache_dtype']}",
        f"KV per token: {report['kv_bytes_per_token']:,} B whole model, "
        f"{report['kv_bytes_per_token_per_gpu']:,} B on the busiest GPU",
        f"weights: {_gib(report['weights']['total_bytes'])} ({report['weights']['source']})",
        f"KV pool: {report['kv_pool_source']}",
        "",
        f"{'GPU':>3}  {'layers':>7}  {'KV heads':>8}  {'KV B/token':>10}  {'weights':>10}"
        f"  {'reserve':>10}  {'KV pool':>10}  {'blocks':>8}",
    ]
    for gpu in report["gpus"]:
        first, last = gpu["layers"]
        lines.append(
            f"{gpu['index']:>3}  {f'{first}-{last - 1}':>7}  {gpu['kv_heads']:>8}  "
            f"{gpu['kv_bytes_per_token']:>10,}  {_gib(gpu['weights_bytes']):>10}  "
            f"{_gib(gpu['reserve_bytes']):>10}  {_gib(gpu['kv_pool_bytes']):>10}  "
            f"{gpu['num_blocks']:>8,}"
        )
    lines += [
        "",
        f"KV cache: {report['num_blocks']:,} blocks of {report['block_size']} = "
        f"{report['kv_cache_tokens']:,} tokens ({'exact' if report['exact'] else 'estimate'})",
        f"max concurrency: {report['max_concurrency_at_max_model_len']:.2f}x at max-model-len "
        f"{report['max_model_len']:,}; {report['max_concurrency_at_budget']:.2f}x at the budget "
        f"of {report['budget_tokens']:,} tokens",
    ]
    if not report["weights_fit"]:
        lines.append("the weights and the reserve do not fit on every card: nothing is left for KV")
    if not report["starts"]:
        lines.append(
            f"vLLM would not start: one {report['max_model_len']:,}-token request needs more "
            "blocks than the cache has"
        )
    worker = report["transformers_worker"]
    lines.append(
        f"transformers worker ({worker['attn_implementation']}, {worker['dtype']}): "
        f"{worker['prompt_tokens']:,}-token prompt = {_gib(worker['kv_bytes_per_request'])} KV + "
        f"{_gib(worker['prefill_transient_bytes'])} prefill; {report['concurrency']} at once "
        f"up to {_gib(worker['peak_bytes_worst'])}"
    )
    lines.extend(f"estimate: {note}" for note in report["estimates"])
    return "\n".join(lines + _advice_lines(report)) + "\n"
