"""Weight bytes: from the index, from safetensors headers (tensors never read), or estimated."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from proxy.plan.config import ConfigError, load_config, parse_config
from proxy.plan.weights import estimate_parameters, model_weights, safetensors_bytes

CONFIGS = Path(__file__).with_name("configs")


def _write_safetensors(path: Path, tensors: dict[str, tuple[int, int]], pad: bytes) -> None:
    """A safetensors file: 8-byte header length, JSON header, then ``pad`` as the data."""
    header = {
        name: {"dtype": "BF16", "shape": [end - begin], "data_offsets": [begin, end]}
        for name, (begin, end) in tensors.items()
    }
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + pad)


def test_safetensors_headers_give_the_tensor_bytes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "llama-3-8b.json").read_text())
    # Data sections of 1,000 + 24 and 4,096 bytes; the files hold only 10 bytes of data,
    # which proves the tensors themselves are never read.
    _write_safetensors(tmp_path / "a.safetensors", {"x": (0, 1000), "y": (1000, 1024)}, b"0" * 10)
    _write_safetensors(tmp_path / "b.safetensors", {"z": (0, 4096)}, b"0" * 10)
    assert safetensors_bytes(tmp_path / "a.safetensors") == 1024
    weights = model_weights(load_config(tmp_path), tmp_path)
    assert (weights.total_bytes, weights.source, weights.exact) == (
        5120, "safetensors headers", True,
    )  # fmt: skip


def test_index_total_size_wins(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "qwen2.5-72b.json").read_text())
    index = {"metadata": {"total_size": 145_412_407_296}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = model_weights(load_config(tmp_path), tmp_path)
    assert weights.total_bytes == 145_412_407_296
    assert weights.source == "model.safetensors.index.json"


def test_not_a_safetensors_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 5) + b"nope!")
    with pytest.raises(ConfigError) as info:
        safetensors_bytes(bad)
    assert info.value.field == "model.safetensors"


def test_estimate_matches_published_parameter_counts() -> None:
    # Published sizes: Llama-3-8B 8.03 B parameters, Qwen2.5-72B 72.7 B (of which
    # the q/k/v biases, left out of the estimate, are 0.01 %), ChatGLM3-6B 6.24 B.
    published = {"llama-3-8b": 8.03e9, "qwen2.5-72b": 72.7e9, "chatglm3-6b": 6.24e9}
    for name, count in published.items():
        layers, other = estimate_parameters(load_config(CONFIGS / f"{name}.json"))
        assert abs(layers + other - count) / count < 0.01, name
    # DeepSeek-V2-Lite: 15.7 B in total (MoE: 64 routed + 2 shared experts).
    layers, other = estimate_parameters(load_config(CONFIGS / "deepseek-v2-lite.json"))
    assert abs(layers + other - 15.7e9) / 15.7e9 < 0.01


def test_quantized_estimate_uses_the_bits() -> None:
    raw = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    plain = model_weights(parse_config(raw), None)
    raw["quantization_config"] = {"quant_method": "awq", "bits": 4}
    quantized = model_weights(parse_config(raw), None)
    layers, other = estimate_parameters(parse_config(raw))
    # 4-bit layers, 16-bit embeddings and LM head.
    assert quantized.total_bytes == layers // 2 + other * 2
    assert quantized.total_bytes < plain.total_bytes / 2.5
    assert not quantized.exact
