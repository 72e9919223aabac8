"""``config.json`` into the few numbers that size a KV cache, or an error naming the field.

The field names follow what vLLM reads (``vllm/transformers_utils/
model_arch_config_convertor.py``): the KV head count is the first of ``n_head_kv``,
``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num`` that is present,
else the attention head count; the head size is MLA's ``kv_lora_rank +
qk_rope_head_dim``, else an explicit ``head_dim``, else ``hidden_size //
num_attention_heads``. A config this module cannot read raises ``ConfigError`` with
the field's name: a guess is never presented as a fact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "ModelConfig", "find_config", "load_config", "parse_config"]


class ConfigError(ValueError):
    """A config the planner cannot read; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


#: Layer kinds whose KV this planner models (``layer_types`` in newer configs).
_FULL = frozenset({"full_attention", "attention", "global", "full"})
_SLIDING = frozenset({"sliding_attention", "sliding_window", "local", "swa"})
#: Fields that announce layers without a per-token KV cache (state-space, linear
#: attention) or per-layer shapes: planning them as plain attention would be a guess.
_UNMODELED = ("ssm_cfg", "mamba_d_state", "linear_attn_config", "block_configs", "attn_type_list")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder, as far as KV memory and weight size go."""

    source: str
    model_type: str
    architecture: str
    num_layers: int
    num_attention_heads: int
    #: KV heads of the whole model; 1 for MLA (one shared latent).
    num_kv_heads: int
    #: Per-head size of K (MLA: the latent plus its rotary part).
    head_dim: int
    #: Per-head size of V (MLA: 0, the latent serves as both).
    v_head_dim: int
    #: "mha", "gqa", "mqa" or "mla".
    attention: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    #: The checkpoint's dtype name ("bfloat16", "float16", "float32").
    dtype: str
    sliding_window: int | None
    #: How many layers attend within ``sliding_window`` (the others attend to all).
    sliding_layers: int
    tie_word_embeddings: bool
    #: Weight bits of a quantized checkpoint (4, 8), None when not quantized.
    quant_bits: int | None
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    #: Leading dense (non-MoE) layers of an MoE model.
    dense_layers: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    mla_v_head_dim: int = 0

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers


def _int(raw: dict[str, Any], field: str, *, required: bool = True) -> int | None:
    value = raw.get(field)
    if value is None:
        if required:
            raise ConfigError(field, "missing; the planner needs it to size the KV cache")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field, f"must be a positive integer, got {value!r}")
    return value


def _first(raw: dict[str, Any], *fields: str) -> tuple[str, int] | None:
    for field in fields:
        if raw.get(field) is not None:
            value = _int(raw, field)
            assert value is not None
            return field, value
    return None


def _need(raw: dict[str, Any], *fields: str) -> int:
    found = _first(raw, *fields)
    if found is None:
        raise ConfigError(fields[0], f"missing (looked for {', '.join(fields)})")
    return found[1]


def _dtype(raw: dict[str, Any]) -> str:
    value = raw.get("torch_dtype", raw.get("dtype")) or "float32"
    value = str(value).removeprefix("torch.")
    aliases = {"half": "float16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
    value = aliases.get(value, value)
    if value not in ("float32", "float16", "bfloat16"):
        raise ConfigError("torch_dtype", f"unknown dtype {value!r}")
    return value


def _quant_bits(raw: dict[str, Any]) -> int | None:
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    if quant.get("load_in_4bit"):
        return 4
    if quant.get("load_in_8bit"):
        return 8
    bits = quant.get("bits", quant.get("w_bit", quant.get("weight_bits")))
    if isinstance(bits, int) and bits > 0:
        return bits
    method = str(quant.get("quant_method", "")).lower()
    if method.startswith("fp8") or method in ("fbgemm_fp8", "compressed-tensors"):
        return 8
    raise ConfigError("quantization_config.bits", f"unknown quantization {method or quant!r}")


def _layers(raw: dict[str, Any], num_layers: int) -> tuple[int | None, int]:
    """The sliding window and how many layers use it."""
    layer_types = raw.get("layer_types")
    window = raw.get("sliding_window")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ConfigError("layer_types", f"must list {num_layers} layer kinds")
        unknown = sorted({str(t) for t in layer_types} - _FULL - _SLIDING)
        if unknown:
            raise ConfigError("layer_types", f"layers of kind {unknown} are not modeled")
        sliding = sum(1 for t in layer_types if t in _SLIDING)
        if sliding and not (isinstance(window, int) and window > 0):
            raise ConfigError("sliding_window", "layer_types has sliding layers but no window")
        return (window if sliding else None), sliding
    if window is None or raw.get("use_sliding_window") is False:
        # Qwen2 configs carry a window that is off unless use_sliding_window is true.
        return None, 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConfigError("sliding_window", f"must be a positive integer, got {window!r}")
    if raw.get("use_sliding_window") and raw.get("max_window_layers") is not None:
        # Qwen2: layers from max_window_layers on use the window.
        first = _int(raw, "max_window_layers")
        assert first is not None
        return window, max(0, num_layers - first)
    return window, num_layers


def _language_model(raw: dict[str, Any]) -> dict[str, Any]:
    """The config of the decoder itself, refused where its layers are not modeled."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json", "must be a JSON object")
    if isinstance(raw.get("text_config"), dict):
        # Multimodal wrappers keep the language model's shape in text_config.
        outer = raw
        raw = {**raw["text_config"]}
        raw.setdefault("torch_dtype", outer.get("torch_dtype", outer.get("dtype")))
    for field in _UNMODELED:
        if field in raw:
            raise ConfigError(field, "this architecture's layers are not modeled by the planner")
    return raw


def _attention(raw: dict[str, Any], heads: int, hidden: int) -> tuple[int, int, int, str]:
    """KV heads, K's head size, V's head size and the attention kind."""
    if raw.get("kv_lora_rank") is not None:
        rank = _int(raw, "kv_lora_rank")
        rope = _int(raw, "qk_rope_head_dim")
        assert rank is not None and rope is not None
        return 1, rank + rope, 0, "mla"
    found = _first(raw, "n_head_kv", "num_kv_heads", "num_key_value_heads")
    if found is None and raw.get("multi_query_attention") is not False:
        found = _first(raw, "multi_query_group_num")
    if found is None and raw.get("multi_query") is True:
        found = ("multi_query", 1)
    kv_heads = found[1] if found else heads
    if heads % kv_heads:
        field = found[0] if found else "num_attention_heads"
        raise ConfigError(field, f"{kv_heads} KV heads do not divide {heads} heads")
    explicit = _first(raw, "head_dim", "kv_channels")
    head_dim = explicit[1] if explicit else hidden // heads
    if not explicit and hidden % heads:
        raise ConfigError("head_dim", f"missing, and {heads} heads do not divide {hidden}")
    kind = "mqa" if kv_heads == 1 and heads > 1 else "mha" if kv_heads == heads else "gqa"
    return kv_heads, head_dim, head_dim, kind


def _max_positions(raw: dict[str, Any]) -> int | None:
    positions = [
        raw[key]
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
        if isinstance(raw.get(key), int) and raw[key] > 0
    ]
    return min(positions) if positions else None


def _experts_and_mla(raw: dict[str, Any]) -> dict[str, Any]:
    """The MoE and MLA fields, 0 (or None) where the config has none."""
    return {
        "num_experts": int(raw.get("n_routed_experts") or raw.get("num_local_experts") or 0),
        "moe_intermediate_size": int(raw.get("moe_intermediate_size") or 0),
        "shared_experts": int(raw.get("n_shared_experts") or 0),
        "dense_layers": int(raw.get("first_k_dense_replace") or 0),
        "q_lora_rank": raw.get("q_lora_rank"),
        "qk_nope_head_dim": int(raw.get("qk_nope_head_dim") or 0),
        "kv_lora_rank": int(raw.get("kv_lora_rank") or 0),
        "qk_rope_head_dim": int(raw.get("qk_rope_head_dim") or 0),
        "mla_v_head_dim": int(raw.get("v_head_dim") or 0),
    }


def parse_config(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The planner's view of a parsed ``config.json``."""
    raw = _language_model(raw)
    num_layers = _need(raw, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
    heads = _need(raw, "num_attention_heads", "n_head", "num_heads")
    hidden = _need(raw, "hidden_size", "n_embd", "d_model")
    architectures = raw.get("architectures") or [""]
    window, sliding_layers = _layers(raw, num_layers)
    kv_heads, head_dim, v_dim, kind = _attention(raw, heads, hidden)
    intermediate = _first(raw, "intermediate_size", "ffn_hidden_size", "n_inner")
    vocab = _need(raw, "vocab_size", "padded_vocab_size")
    return ModelConfig(
        source=source,
        model_type=str(raw.get("model_type", "")),
        architecture=str(architectures[0]),
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_dim,
        attention=kind,
        hidden_size=hidden,
        intermediate_size=intermediate[1] if intermediate else 4 * hidden,
        vocab_size=vocab,
        max_position_embeddings=_max_positions(raw),
        dtype=_dtype(raw),
        sliding_window=window,
        sliding_layers=sliding_layers,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        quant_bits=_quant_bits(raw),
        **_experts_and_mla(raw),
    )


def find_config(path: Path) -> Path:
    """``path`` itself when it is a file, else ``path/config.json``."""
    candidate = path / "config.json" if path.is_dir() else path
    if not candidate.is_file():
        raise ConfigError("config.json", f"no such file: {candidate}")
    return candidate


def load_config(path: Path) -> ModelConfig:
    """Read a model directory's (or a file's) ``config.json``."""
    file = find_config(Path(path))
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("config.json", f"cannot read {file}: {exc}") from None
    return parse_config(raw, str(file))
