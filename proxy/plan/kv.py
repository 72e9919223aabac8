"""KV bytes per token, from the model's shape and the KV cache's dtype.

Per layer and token a cache holds K and V for each KV head:
``kv_heads x (head_dim + v_head_dim) x bytes``. MLA (DeepSeek) stores one latent of
``kv_lora_rank + qk_rope_head_dim`` per layer and token instead, with no separate V.
The same sums are vLLM's ``AttentionSpec.page_size_bytes`` divided by the block size.
"""

from __future__ import annotations

from proxy.plan.config import ConfigError, ModelConfig

__all__ = [
    "DTYPE_BYTES",
    "kv_bytes_for_tokens",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "resolve_dtype",
    "resolve_kv_dtype",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def resolve_dtype(config: ModelConfig, dtype: str = "auto") -> str:
    """The dtype the engine runs the model in (vLLM's ``--dtype``).

    ``auto`` is the checkpoint's dtype, except that float32 checkpoints are run in
    bfloat16 (vLLM's ``_resolve_auto_dtype`` downcasts float32 to the platform's first
    supported dtype, bfloat16 on current GPUs and x86 CPUs).
    """
    if dtype == "auto":
        return "bfloat16" if config.dtype == "float32" else config.dtype
    aliases = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
    dtype = aliases.get(dtype, dtype)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ConfigError("--dtype", f"unknown dtype {dtype!r} (auto, float16, bfloat16, float32)")
    return dtype


def resolve_kv_dtype(model_dtype: str, kv_cache_dtype: str = "auto") -> str:
    """The KV cache's dtype (vLLM's ``--kv-cache-dtype``): ``auto`` is the model's."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in DTYPE_BYTES:
        raise ConfigError(
            "--kv-cache-dtype", f"unknown {kv_cache_dtype!r} (auto, fp8, fp8_e4m3, fp8_e5m2)"
        )
    return kv_cache_dtype


def kv_bytes_per_token_per_layer(config: ModelConfig, kv_dtype: str, tp: int = 1) -> int:
    """One layer's KV bytes for one token on one tensor-parallel rank.

    A rank holds ``max(1, kv_heads // tp)`` heads: heads are split, or replicated when
    there are fewer than ranks (vLLM's ``ModelConfig.get_num_kv_heads``). MLA's latent
    is not split: every rank holds all of it.
    """
    heads = config.num_kv_heads if config.attention == "mla" else max(1, config.num_kv_heads // tp)
    return heads * (config.head_dim + config.v_head_dim) * DTYPE_BYTES[kv_dtype]


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str) -> int:
    """The whole model's KV bytes per token (all layers, no parallelism)."""
    return config.num_layers * kv_bytes_per_token_per_layer(config, kv_dtype)


def kv_bytes_for_tokens(config: ModelConfig, kv_dtype: str, tokens: int) -> int:
    """KV bytes one sequence of ``tokens`` holds: sliding-window layers keep at most the window.

    This is what a transformers worker (or an engine that frees out-of-window blocks)
    holds; vLLM keeps up to a block more per sliding layer (see ``capacity``).
    """
    per_layer = kv_bytes_per_token_per_layer(config, kv_dtype)
    window = config.sliding_window or tokens
    return per_layer * (config.full_layers * tokens + config.sliding_layers * min(tokens, window))
