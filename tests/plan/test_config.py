"""Configs the planner cannot read are refused with the field's name, never guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.plan.config import ConfigError, load_config, parse_config

BASE: dict[str, Any] = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 128,
    "vocab_size": 100,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"num_attention_heads": None}, "num_attention_heads"),
        ({"hidden_size": None}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_key_value_heads": "two"}, "num_key_value_heads"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
        ({"layer_types": ["full_attention", "linear_attention"]}, "layer_types"),
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"ssm_cfg": {}}, "ssm_cfg"),
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
        ({"sliding_window": -1}, "sliding_window"),
        ({"quantization_config": {"quant_method": "mystery"}}, "quantization_config.bits"),
    ],
)
def test_unreadable_field_is_named(change: dict[str, Any], field: str) -> None:
    raw = {**BASE, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert info.value.field == "config.json"


def test_layer_types_count_the_sliding_layers() -> None:
    kinds = ["sliding_attention", "full_attention"]
    config = parse_config({**BASE, "layer_types": kinds, "sliding_window": 512})
    assert (config.sliding_window, config.sliding_layers, config.full_layers) == (512, 1, 1)


def test_multimodal_wrapper_reads_text_config() -> None:
    config = parse_config({"architectures": ["X"], "torch_dtype": "float16", "text_config": BASE})
    assert (config.num_layers, config.num_kv_heads, config.dtype) == (2, 2, "bfloat16")


def test_quantized_checkpoint_bits() -> None:
    config = parse_config({**BASE, "quantization_config": {"quant_method": "awq", "bits": 4}})
    assert config.quant_bits == 4
