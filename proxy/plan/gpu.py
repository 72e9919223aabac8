"""How a model's layers and KV heads spread over the cards.

* Tensor parallelism (vLLM ``--tensor-parallel-size``): every card holds every layer
  and ``max(1, kv_heads // tp)`` KV heads of it.
* Pipeline parallelism (``--pipeline-parallel-size``) and FastChat's ``--num-gpus``
  (accelerate spreads the layers): each card holds its own layers' KV only, so the
  card with the most layers fills first. vLLM's split is ``get_pp_indices``: an even
  share each, the remainder added to the stages just before the last.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.plan.config import ConfigError, ModelConfig
from proxy.plan.kv import kv_bytes_per_token_per_layer

__all__ = ["Card", "layer_partition", "split_cards"]


@dataclass(frozen=True)
class Card:
    """One GPU (or CPU worker): which layers it holds and their KV per token."""

    index: int
    pp_rank: int
    tp_rank: int
    first_layer: int
    last_layer: int  # exclusive
    kv_heads: int
    kv_bytes_per_token: int

    @property
    def layers(self) -> int:
        return self.last_layer - self.first_layer


def layer_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's ``get_pp_indices`` assigns them."""
    if pp < 1 or pp > num_layers:
        raise ConfigError("--pipeline-parallel-size", f"must be 1..{num_layers}, got {pp}")
    parts = [num_layers // pp] * pp
    # The remainder goes to the stages before the last (which holds the final norm
    # and the LM head), counted from the end.
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def split_cards(config: ModelConfig, kv_dtype: str, tp: int = 1, pp: int = 1) -> list[Card]:
    """The cards of a ``tp x pp`` deployment, in rank order (vLLM: PP outer, TP inner)."""
    if tp < 1:
        raise ConfigError("--tensor-parallel-size", f"must be at least 1, got {tp}")
    if config.num_attention_heads % tp:
        raise ConfigError(
            "--tensor-parallel-size",
            f"{config.num_attention_heads} attention heads do not split over {tp} GPUs",
        )
    per_layer = kv_bytes_per_token_per_layer(config, kv_dtype, tp)
    heads = 1 if config.attention == "mla" else max(1, config.num_kv_heads // tp)
    cards: list[Card] = []
    start = 0
    for pp_rank, layers in enumerate(layer_partition(config.num_layers, pp)):
        for tp_rank in range(tp):
            cards.append(
                Card(
                    index=len(cards),
                    pp_rank=pp_rank,
                    tp_rank=tp_rank,
                    first_layer=start,
                    last_layer=start + layers,
                    kv_heads=heads,
                    kv_bytes_per_token=per_layer * layers,
                )
            )
        start += layers
    return cards
