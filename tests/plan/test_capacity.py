"""Capacity: vLLM's block arithmetic, written out by hand, and the per-card split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.plan.advice import admission_capacity, fallbacks, fits, prompt_budget
from proxy.plan.capacity import GIB
from proxy.plan.config import load_config, parse_config
from proxy.plan.gpu import layer_partition, split_cards
from proxy.plan.planner import PlanInputs, make_plan

CONFIGS = Path(__file__).with_name("configs")


def _tiny(layers: int, heads: int, kv_heads: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_size": 128,
        "head_dim": 64, "intermediate_size": 256, "vocab_size": 4096,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    }  # fmt: skip


def test_cpu_pool_is_the_kv_space_exactly() -> None:
    # 2 layers x 1 KV head x (64 + 64) x 2 B = 512 B a token; a block of 32 tokens is
    # 16,384 B; 1 GiB / 16,384 = 65,536 blocks; at max_model_len 4,096 a request takes
    # 128 blocks, so 65,536 / 128 = 512 requests and 512 x 4,096 = 2,097,152 tokens.
    plan = make_plan(
        PlanInputs(parse_config(_tiny(2, 2, 1)), device="cpu", cpu_kv_cache_space_gib=1,
                   block_size=32)
    )  # fmt: skip
    cap = plan.capacity
    assert (cap.num_blocks, cap.kv_cache_tokens) == (65_536, 2_097_152)
    assert cap.max_concurrency_at_max_model_len == 512.0
    assert cap.exact


def test_kv_cache_tokens_follow_vllms_float_expression() -> None:
    # 6 layers x 2 heads x 128 x 2 B = 3,072 B a token, 98,304 B a block;
    # 2^30 // 98,304 = 10,922 blocks. max_model_len 1,000 = cdiv(1,000, 32) = 32 blocks:
    # int(10,922 / 32 x 1,000) = int(341,312.5) = 341,312 (not 10,922 x 32 = 349,504).
    plan = make_plan(
        PlanInputs(parse_config(_tiny(6, 4, 2)), device="cpu", cpu_kv_cache_space_gib=1,
                   block_size=32, max_model_len=1000)
    )  # fmt: skip
    assert (plan.capacity.num_blocks, plan.capacity.kv_cache_tokens) == (10_922, 341_312)


def test_cpu_block_size_defaults_to_128_like_vllm() -> None:
    plan = make_plan(
        PlanInputs(parse_config(_tiny(2, 2, 1)), device="cpu", cpu_kv_cache_space_gib=1)
    )
    # 512 B x 128 = 65,536 B a block: 16,384 blocks.
    assert (plan.capacity.block_size, plan.capacity.num_blocks) == (128, 16_384)


def test_pipeline_stages_split_like_get_pp_indices() -> None:
    # 80 // 3 = 26, remainder 2 goes to the two stages before the last.
    assert layer_partition(80, 3) == [27, 27, 26]
    assert layer_partition(27, 4) == [7, 7, 7, 6]
    assert layer_partition(32, 2) == [16, 16]
    config = load_config(CONFIGS / "qwen2.5-72b.json")
    cards = split_cards(config, "bfloat16", tp=2, pp=3)
    # Each card: its stage's layers x 4 KV heads (8 // 2) x 256 x 2 B = layers x 2,048.
    assert [card.kv_bytes_per_token for card in cards] == [55_296] * 4 + [53_248] * 2
    assert [(c.first_layer, c.last_layer) for c in cards[::2]] == [(0, 27), (27, 54), (54, 80)]


def test_gpu_pool_is_memory_times_util_minus_weights_and_reserve() -> None:
    config = load_config(CONFIGS / "llama-3-8b.json")
    plan = make_plan(
        PlanInputs(config, gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9,
                   reserve_bytes=2 * GIB, max_model_len=8192)
    )  # fmt: skip
    row = plan.capacity.cards[0]
    assert row.pool_bytes == int(80 * GIB * 0.9) - row.weights_bytes - 2 * GIB
    # 131,072 B a token x 16 = 2,097,152 B a block.
    assert row.num_blocks == row.pool_bytes // 2_097_152
    assert not plan.capacity.exact


def test_advice_for_n_sessions() -> None:
    config = parse_config(_tiny(2, 2, 1))
    plan = make_plan(
        PlanInputs(config, device="cpu", cpu_kv_cache_space_gib=1, block_size=32,
                   concurrency=100, completion_reserve=512)
    )  # fmt: skip
    # 65,535 usable blocks (one is the null block) // 100 = 655 blocks = 20,960 tokens,
    # capped at max_model_len 4,096; minus the 512 reserve = 3,584.
    assert prompt_budget(plan) == 3_584
    # (65,535 - 100) x 32: each of 100 requests can waste up to a block.
    assert admission_capacity(plan) == 2_093_920
    assert fits(plan)


def test_tight_plan_does_not_fit_and_fallbacks_say_what_helps() -> None:
    config = load_config(CONFIGS / "qwen2.5-72b.json")
    plan = make_plan(
        PlanInputs(config, tensor_parallel_size=2, gpu_memory_bytes=80 * GIB,
                   concurrency=16, max_model_len=32768)
    )  # fmt: skip
    assert not fits(plan)
    steps = {step["step"].split(" (")[0]: step for step in fallbacks(plan)}
    assert "shorten max_tokens / --max-model-len" in steps
    more = steps["more GPUs"]
    assert more["args"] == ["--tensor-parallel-size", "4"]
    assert more["effect"]["kv_cache_tokens"] > plan.capacity.kv_cache_tokens
