"""The checkpoint's weight bytes: measured from its files when there are any, else estimated.

In order:

1. ``model.safetensors.index.json``'s ``metadata.total_size`` (exact: the sum of the
   tensors' bytes, written by ``save_pretrained``);
2. the ``*.safetensors`` headers: each file starts with an 8-byte little-endian length
   and a JSON header giving every tensor's ``data_offsets``. Only the headers are read,
   never the tensors (exact);
3. an estimate from the config: the parameters of embeddings, attention, MLP (or MoE
   experts) and norms, times the dtype's bytes or the quantization's bits.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from proxy.plan.config import ConfigError, ModelConfig
from proxy.plan.kv import DTYPE_BYTES

__all__ = ["Weights", "estimate_parameters", "model_weights", "safetensors_bytes"]

#: A header above this is not a safetensors file (the format caps it at 100 MB).
_MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class Weights:
    total_bytes: int
    #: The share of ``total_bytes`` in the layers (the rest: embeddings, LM head, norm).
    layer_fraction: float
    #: "index", "safetensors headers" or "estimate from config.json".
    source: str

    @property
    def exact(self) -> bool:
        return self.source != "estimate from config.json"


def safetensors_bytes(path: Path) -> int:
    """The tensors' bytes in one safetensors file, from its header alone."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ConfigError(path.name, "not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER:
            raise ConfigError(path.name, "not a safetensors file (header length too large)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ConfigError(path.name, "not a safetensors file (header is not JSON)") from None
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        total += int(end) - int(begin)
    return total


def estimate_parameters(config: ModelConfig) -> tuple[int, int]:
    """(parameters in the layers, parameters outside them), from the config's shape."""
    h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_kv_heads
    if config.attention == "mla":
        # DeepSeek-V2: q (or q_a + q_b), kv_a (latent + rope), kv_b (latent -> K_nope, V), o.
        qk = config.qk_nope_head_dim + config.qk_rope_head_dim
        rank = config.q_lora_rank
        q = h * heads * qk if not rank else h * rank + rank * heads * qk
        kv_a = h * (config.kv_lora_rank + config.qk_rope_head_dim)
        kv_b = config.kv_lora_rank * heads * (config.qk_nope_head_dim + config.mla_v_head_dim)
        attention = q + kv_a + kv_b + heads * config.mla_v_head_dim * h
    else:
        d = config.head_dim
        attention = h * heads * d + 2 * h * kv * d + heads * d * h
    dense_mlp = 3 * h * config.intermediate_size
    if config.num_experts:
        expert = 3 * h * config.moe_intermediate_size
        moe = (config.num_experts + config.shared_experts) * expert + h * config.num_experts
        dense = min(config.dense_layers, config.num_layers)
        mlp_total = dense * dense_mlp + (config.num_layers - dense) * moe
    else:
        mlp_total = config.num_layers * dense_mlp
    layers = config.num_layers * (attention + 2 * h) + mlp_total
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2) + h
    return layers, embeddings


def _estimate(config: ModelConfig) -> Weights:
    layers, other = estimate_parameters(config)
    if config.quant_bits:
        # Quantized layers; embeddings and the LM head usually stay in 16 bits.
        total = layers * config.quant_bits // 8 + other * 2
        layer_bytes = layers * config.quant_bits // 8
    else:
        size = DTYPE_BYTES[config.dtype]
        total, layer_bytes = (layers + other) * size, layers * size
    return Weights(total, layer_bytes / total, "estimate from config.json")


def model_weights(config: ModelConfig, model_dir: Path | None) -> Weights:
    """The weights of the checkpoint in ``model_dir`` (or estimated when it has none)."""
    estimate = _estimate(config)
    if model_dir is None or not model_dir.is_dir():
        return estimate
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text())["metadata"]["total_size"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(index.name, "has no readable metadata.total_size") from None
        return Weights(int(total), estimate.layer_fraction, "model.safetensors.index.json")
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        total = sum(safetensors_bytes(file) for file in files)
        return Weights(total, estimate.layer_fraction, "safetensors headers")
    return estimate
