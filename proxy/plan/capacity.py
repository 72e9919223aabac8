"""KV capacity: the pool each card gives the cache, whole blocks, tokens, concurrency.

The block arithmetic is vLLM's (``vllm/v1/core/kv_cache_utils.py``, v0.32):

* bytes per block = the card's layers x ``block_size`` x per-layer KV bytes per token
  (``get_kv_cache_config_from_groups``: one page per layer, pages of a uniform model
  summed);
* ``num_blocks = pool // bytes_per_block``, then the smallest over all cards
  (``get_kv_cache_configs``);
* ``kv_cache_size_tokens = int(num_blocks / blocks_per_request x max_model_len)`` with
  ``blocks_per_request = cdiv(max_model_len, block_size)`` for full attention
  (``get_kv_cache_capacity``) — the "KV cache size: N tokens" of the start-up log.
  One block (the null block) is never handed to a request.

The pool: on CPU, ``VLLM_CPU_KVCACHE_SPACE`` GiB per worker exactly
(``CpuPlatform.check_and_update_config`` sets ``kv_cache_memory_bytes`` to it and
``CPUWorker.determine_available_memory`` returns it as is). On GPU, vLLM profiles:
``memory x gpu_memory_utilization - weights - peak activations - non-torch memory``;
the last two are this module's documented estimate (``reserve_bytes``), or ``--reserve``.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.plan.config import ModelConfig
from proxy.plan.gpu import Card
from proxy.plan.kv import DTYPE_BYTES
from proxy.plan.weights import Weights

__all__ = [
    "GIB",
    "Capacity",
    "CardPool",
    "blocks_per_request",
    "card_weights",
    "cdiv",
    "concurrency",
    "kv_capacity",
    "reserve_bytes",
]

GIB = 1 << 30
#: vLLM's defaults for an OpenAI server on a large GPU (scheduler config).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CardPool:
    card: Card
    weights_bytes: int
    reserve_bytes: int
    pool_bytes: int
    bytes_per_block: int
    num_blocks: int


@dataclass(frozen=True)
class Capacity:
    device: str
    block_size: int
    max_model_len: int
    cards: list[CardPool]
    #: vLLM's ``num_gpu_blocks``: the smallest card's count.
    num_blocks: int
    #: vLLM's ``kv_cache_size_tokens``.
    kv_cache_tokens: int
    blocks_per_request: int
    max_concurrency_at_max_model_len: float
    #: True when every input is exact (CPU pool, full-attention layers).
    exact: bool
    pool_source: str

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1)

    @property
    def starts(self) -> bool:
        """vLLM refuses to start when one ``max_model_len`` request does not fit."""
        return self.usable_blocks >= self.blocks_per_request


def blocks_per_request(
    config: ModelConfig, tokens: int, block_size: int, max_num_batched_tokens: int
) -> int:
    """Blocks one request of ``tokens`` takes (vLLM's ``max_memory_usage_bytes`` / page).

    Sliding-window layers (all layers; vLLM's ``SlidingWindowSpec``) keep the window, the
    tokens in flight, and one block for a window that starts mid-block.
    """
    if config.sliding_window and config.sliding_layers == config.num_layers:
        held = min(config.sliding_window - 1 + max_num_batched_tokens, tokens)
        return cdiv(held, block_size) + 1
    return cdiv(tokens, block_size)


def concurrency(
    config: ModelConfig, num_blocks: int, tokens: int, block_size: int, batched: int
) -> float:
    """Requests of ``tokens`` the cache holds at once (vLLM's max concurrency)."""
    return num_blocks / blocks_per_request(config, tokens, block_size, batched)


def card_weights(weights: Weights, card: Card, num_layers: int, tp: int, pp: int) -> int:
    """One card's share of the weights: its layers over TP, plus embeddings / LM head."""
    layer_bytes = weights.total_bytes * weights.layer_fraction
    other = weights.total_bytes - layer_bytes
    own = layer_bytes * card.layers / num_layers
    # Under PP the embedding sits on the first stage, the LM head and norm on the last.
    extra = other if pp == 1 else other / 2 if card.pp_rank in (0, pp - 1) else 0.0
    return int((own + extra) / tp)


def reserve_bytes(
    config: ModelConfig, tp: int, dtype: str, batched_tokens: int, max_num_seqs: int
) -> int:
    """The estimate of what a vLLM GPU worker holds besides weights and KV.

    1 GiB for the CUDA context, NCCL, CUDA graphs and the allocator's slack, plus the
    profile run's peak activations: ``max_num_batched_tokens`` rows of a layer's hidden
    states and MLP intermediates (``4 x hidden + 2 x intermediate / tp`` values each),
    plus the sampler's float32 logits and probabilities for ``max_num_seqs`` rows.
    """
    width = 4 * config.hidden_size + 2 * config.intermediate_size // tp
    activations = batched_tokens * width * DTYPE_BYTES[dtype]
    sampler = max_num_seqs * (config.vocab_size // tp) * 4 * 2
    return GIB + activations + sampler


def kv_capacity(
    config: ModelConfig,
    cards: list[Card],
    pools: list[tuple[int, int, int]],
    *,
    device: str,
    block_size: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    exact: bool,
    pool_source: str,
) -> Capacity:
    """Blocks and tokens from each card's (weights, reserve, pool bytes)."""
    rows: list[CardPool] = []
    for card, (weights, reserve, pool) in zip(cards, pools, strict=True):
        per_block = card.kv_bytes_per_token * block_size
        blocks = max(0, pool) // per_block if per_block else 0
        rows.append(CardPool(card, weights, reserve, pool, per_block, blocks))
    num_blocks = min(row.num_blocks for row in rows)
    per_request = blocks_per_request(config, max_model_len, block_size, max_num_batched_tokens)
    # vLLM's float expression, kept as is so the rounding matches.
    max_conc = num_blocks / per_request
    return Capacity(
        device=device,
        block_size=block_size,
        max_model_len=max_model_len,
        cards=rows,
        num_blocks=num_blocks,
        kv_cache_tokens=int(max_conc * max_model_len),
        blocks_per_request=per_request,
        max_concurrency_at_max_model_len=max_conc,
        exact=exact and not config.sliding_layers,
        pool_source=pool_source,
    )
