"""KV bytes per token of published architectures, against arithmetic written out here.

Per layer and token: ``kv_heads x (K size + V size) x bytes``; per GPU under tensor
parallelism ``max(1, kv_heads // tp)`` heads. The fixture configs in ``configs/`` carry
the published shapes (the fields the KV size depends on, as in each model's
config.json).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.plan.config import ConfigError, ModelConfig, load_config
from proxy.plan.gpu import split_cards
from proxy.plan.kv import (
    kv_bytes_for_tokens,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    resolve_dtype,
    resolve_kv_dtype,
)

CONFIGS = Path(__file__).with_name("configs")

# name: (total bytes per token, {tp: bytes per token on one GPU})
EXPECTED = {
    # Llama-3-8B: 32 layers, 8 KV heads of 128, bf16.
    # total = 32 x 8 x (128 + 128) x 2 = 131,072
    # TP2: 4 heads -> 32 x 4 x 256 x 2 = 65,536; TP4: 2 -> 32,768; TP8: 1 -> 16,384
    "llama-3-8b": (131_072, {1: 131_072, 2: 65_536, 4: 32_768, 8: 16_384}),
    # Qwen2.5-7B: 28 layers, 4 KV heads, head_dim = 3584 / 28 = 128, bf16.
    # total = 28 x 4 x 256 x 2 = 57,344; TP2: 2 heads -> 28,672; TP4: 1 -> 14,336;
    # TP8: 4 // 8 = 0 -> replicated, 1 head -> 14,336
    "qwen2.5-7b": (57_344, {1: 57_344, 2: 28_672, 4: 14_336, 8: 14_336}),
    # Qwen2.5-72B: 80 layers, 8 KV heads of 128 (8192 / 64), bf16.
    # total = 80 x 8 x 256 x 2 = 327,680; TP2: 163,840; TP4: 81,920; TP8: 40,960
    "qwen2.5-72b": (327_680, {1: 327_680, 2: 163_840, 4: 81_920, 8: 40_960}),
    # ChatGLM3-6B: 28 layers (num_layers), multi_query_group_num 2, kv_channels 128, fp16.
    # total = 28 x 2 x 256 x 2 = 28,672; TP2: 1 group -> 14,336; TP4, TP8: 2 // 4 = 0
    # -> replicated, 1 group each -> 14,336
    "chatglm3-6b": (28_672, {1: 28_672, 2: 14_336, 4: 14_336, 8: 14_336}),
    # Mistral-7B-v0.1: Llama-3-8B's attention shape (32 layers, 8 KV heads of 128), bf16.
    "mistral-7b-v0.1": (131_072, {1: 131_072, 2: 65_536, 4: 32_768, 8: 16_384}),
    # DeepSeek-V2-Lite (MLA): 27 layers, one latent of kv_lora_rank 512 + qk_rope_head_dim
    # 64 = 576, no separate V, bf16: 27 x 576 x 2 = 31,104; every TP rank holds the
    # whole latent -> 31,104 at every TP
    "deepseek-v2-lite": (31_104, {1: 31_104, 2: 31_104, 4: 31_104, 8: 31_104}),
}


def _config(name: str) -> ModelConfig:
    return load_config(CONFIGS / f"{name}.json")


def _kv_dtype(config: ModelConfig) -> str:
    return resolve_kv_dtype(resolve_dtype(config))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_bytes_per_token_whole_model(name: str) -> None:
    config = _config(name)
    assert kv_bytes_per_token(config, _kv_dtype(config)) == EXPECTED[name][0]


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_bytes_per_token_per_gpu(name: str, tp: int) -> None:
    config = _config(name)
    per_gpu = config.num_layers * kv_bytes_per_token_per_layer(config, _kv_dtype(config), tp)
    assert per_gpu == EXPECTED[name][1][tp]
    if config.num_attention_heads % tp:
        # Qwen2.5-7B's 28 attention heads do not split over 8 GPUs: vLLM refuses, so does
        # the plan, naming the flag.
        with pytest.raises(ConfigError) as info:
            split_cards(config, _kv_dtype(config), tp)
        assert info.value.field == "--tensor-parallel-size"
    else:
        cards = split_cards(config, _kv_dtype(config), tp)
        assert len(cards) == tp
        assert {card.kv_bytes_per_token for card in cards} == {EXPECTED[name][1][tp]}


def test_shapes_read_from_the_fields_each_family_uses() -> None:
    glm = _config("chatglm3-6b")
    assert (glm.num_layers, glm.num_kv_heads, glm.head_dim, glm.attention) == (28, 2, 128, "gqa")
    mla = _config("deepseek-v2-lite")
    assert (mla.attention, mla.num_kv_heads, mla.head_dim, mla.v_head_dim) == ("mla", 1, 576, 0)
    # Qwen2 configs carry sliding_window with use_sliding_window false: no window.
    assert _config("qwen2.5-7b").sliding_window is None
    mistral = _config("mistral-7b-v0.1")
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, 32)


def test_sliding_window_caps_what_a_sequence_holds() -> None:
    config = _config("mistral-7b-v0.1")
    # 10,000 tokens, every layer keeps the last 4,096: 131,072 x 4,096 = 536,870,912
    assert kv_bytes_for_tokens(config, "bfloat16", 10_000) == 536_870_912
    # Below the window nothing is capped: 131,072 x 1,000
    assert kv_bytes_for_tokens(config, "bfloat16", 1_000) == 131_072_000


def test_fp8_kv_halves_a_16_bit_cache() -> None:
    config = _config("llama-3-8b")
    # 32 x 8 x 256 x 1 byte = 65,536
    assert kv_bytes_per_token(config, resolve_kv_dtype("bfloat16", "fp8")) == 65_536


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    from proxy.plan.config import parse_config

    raw = {
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 512, "head_dim": 128, "vocab_size": 1000, "torch_dtype": "float16",
    }  # fmt: skip
    config = parse_config(raw)
    # 4 layers x 2 heads x (128 + 128) x 2 = 4,096 (hidden / heads would give 64: 2,048)
    assert config.head_dim == 128
    assert kv_bytes_per_token(config, "float16") == 4_096


def test_float32_checkpoints_run_in_bfloat16_under_auto() -> None:
    from proxy.plan.config import parse_config

    raw = {
        "num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 64,
        "vocab_size": 10, "torch_dtype": "float32",
    }  # fmt: skip
    config = parse_config(raw)
    assert resolve_dtype(config) == "bfloat16"
    assert resolve_dtype(config, "float32") == "float32"
