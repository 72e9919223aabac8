"""One plan: the model, its cards, their KV pools and capacity, from the operator's inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from proxy.plan.capacity import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    GIB,
    Capacity,
    card_weights,
    kv_capacity,
    reserve_bytes,
)
from proxy.plan.config import ConfigError, ModelConfig
from proxy.plan.gpu import Card, split_cards
from proxy.plan.kv import kv_bytes_per_token, resolve_dtype, resolve_kv_dtype
from proxy.plan.weights import Weights, model_weights

__all__ = ["Plan", "PlanInputs", "make_plan"]

#: vLLM's default ``--block-size`` per device (CPU: ``CpuPlatform`` picks 128 unless
#: the user names one; MLA on CPU is forced to 16).
DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}
#: What VLLM_CPU_KVCACHE_SPACE defaults to in vLLM's documentation.
DEFAULT_CPU_KV_SPACE_GIB = 4


@dataclass(frozen=True)
class PlanInputs:
    config: ModelConfig
    model_dir: Path | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_bytes: int = 80 * GIB
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    device: str = "cuda"
    cpu_kv_cache_space_gib: int | None = None
    concurrency: int | None = None
    completion_reserve: int = 512
    reserve_bytes: int | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    attn_implementation: str = "eager"


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    dtype: str
    kv_dtype: str
    kv_bytes_per_token: int
    cards: list[Card]
    weights: Weights
    capacity: Capacity
    concurrency: int
    estimates: list[str]

    @property
    def config(self) -> ModelConfig:
        return self.inputs.config

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        return max(card.kv_bytes_per_token for card in self.cards)


def _max_model_len(inputs: PlanInputs) -> int:
    if inputs.max_model_len is not None:
        if inputs.max_model_len < 1:
            raise ConfigError("--max-model-len", "must be at least 1")
        return inputs.max_model_len
    if inputs.config.max_position_embeddings is None:
        raise ConfigError(
            "max_position_embeddings", "missing from config.json; pass --max-model-len"
        )
    return inputs.config.max_position_embeddings


def _block_size(inputs: PlanInputs) -> tuple[int, list[str]]:
    notes: list[str] = []
    size = inputs.block_size or DEFAULT_BLOCK_SIZE[inputs.device]
    if inputs.device == "cpu" and inputs.config.attention == "mla" and size != 16:
        notes.append("vLLM's reference CPU MLA backend forces --block-size 16 (not AMX MLA)")
        size = 16
    if size < 1:
        raise ConfigError("--block-size", "must be at least 1")
    return size, notes


#: Each card's (weights held, reserve, KV pool) in bytes, where the pool's size came
#: from, and whether that size is the engine's own figure rather than an estimate.
_Pools = tuple[list[tuple[int, int, int]], str, bool]


def _cpu_pools(inputs: PlanInputs, cards: list[Card], estimates: list[str]) -> _Pools:
    space = inputs.cpu_kv_cache_space_gib
    if space is None:
        estimates.append(
            f"VLLM_CPU_KVCACHE_SPACE not given: {DEFAULT_CPU_KV_SPACE_GIB} GiB assumed "
            "(unset, vLLM sizes the cache from free memory)"
        )
        space = DEFAULT_CPU_KV_SPACE_GIB
    if space < 1:
        raise ConfigError("--cpu-kv-cache-space", "must be a whole number of GiB, at least 1")
    pools = [(0, 0, space * GIB) for _ in cards]
    source = f"VLLM_CPU_KVCACHE_SPACE={space} GiB per worker"
    exact = inputs.cpu_kv_cache_space_gib is not None and inputs.config.attention != "mla"
    return pools, source, exact


def _gpu_pools(
    inputs: PlanInputs, cards: list[Card], weights: Weights, dtype: str, estimates: list[str]
) -> _Pools:
    config, tp, pp = inputs.config, inputs.tensor_parallel_size, inputs.pipeline_parallel_size
    # The advice sets --max-num-seqs to the sessions planned for; the sampler's share
    # of the reserve follows it.
    seqs = inputs.max_num_seqs or inputs.concurrency or DEFAULT_MAX_NUM_SEQS
    pools = []
    for card in cards:
        held = card_weights(weights, card, config.num_layers, tp, pp)
        if inputs.reserve_bytes is not None:
            reserve = inputs.reserve_bytes
        else:
            reserve = reserve_bytes(config, tp, dtype, inputs.max_num_batched_tokens, seqs)
        budget = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
        pools.append((held, reserve, budget - held - reserve))
    source = (
        f"{inputs.gpu_memory_bytes / GIB:.2f} GiB x {inputs.gpu_memory_utilization:g} "
        "- weights - reserve, per GPU"
    )
    estimates.append(
        "GPU pool: the activation/overhead reserve is an estimate (vLLM profiles it "
        "at start-up); read the real figure with --from-engine"
    )
    return pools, source, False


def _model_estimates(inputs: PlanInputs, weights: Weights, estimates: list[str]) -> None:
    if not weights.exact and inputs.device == "cuda":
        estimates.append("weights estimated from config.json (no checkpoint files given)")
    if inputs.config.sliding_layers:
        estimates.append(
            "sliding-window layers: vLLM holds window + tokens in flight per request; "
            f"tokens in flight taken as --max-num-batched-tokens {inputs.max_num_batched_tokens}"
        )


def make_plan(inputs: PlanInputs) -> Plan:
    """Everything the report and the advice are built from."""
    config = inputs.config
    if inputs.device not in ("cuda", "cpu"):
        raise ConfigError("--device", f"must be cuda or cpu, not {inputs.device!r}")
    dtype = resolve_dtype(config, inputs.dtype)
    kv_dtype = resolve_kv_dtype(dtype, inputs.kv_cache_dtype)
    cards = split_cards(
        config, kv_dtype, inputs.tensor_parallel_size, inputs.pipeline_parallel_size
    )
    weights = model_weights(config, inputs.model_dir)
    max_len = _max_model_len(inputs)
    block_size, estimates = _block_size(inputs)
    if inputs.device == "cpu":
        pools, source, exact = _cpu_pools(inputs, cards, estimates)
    else:
        pools, source, exact = _gpu_pools(inputs, cards, weights, dtype, estimates)
    _model_estimates(inputs, weights, estimates)
    capacity = kv_capacity(
        config,
        cards,
        pools,
        device=inputs.device,
        block_size=block_size,
        max_model_len=max_len,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        exact=exact,
        pool_source=source,
    )
    concurrency = inputs.concurrency or inputs.max_num_seqs or 8
    if concurrency < 1:
        raise ConfigError("--concurrency", "must be at least 1")
    return Plan(
        inputs=inputs,
        dtype=dtype,
        kv_dtype=kv_dtype,
        kv_bytes_per_token=kv_bytes_per_token(config, kv_dtype),
        cards=cards,
        weights=weights,
        capacity=capacity,
        concurrency=concurrency,
        estimates=estimates,
    )


def replan(plan: Plan, **changes: object) -> Plan:
    """The same plan with some inputs changed (the fallbacks' computed effects)."""
    return make_plan(replace(plan.inputs, **changes))  # type: ignore[arg-type]
