"""Peak memory of a transformers worker (FastChat ``model_worker``) per request.

A transformers worker gives every request its own KV cache (``DynamicCache``: K and V
per layer, in the model's dtype) and runs the prompt's prefill in one forward pass.
What that pass allocates on top of the cache, per attention implementation:

* ``eager``: each layer materialises its scores, ``heads x n²`` values, one layer at a
  time, and the model builds an additive ``n x n`` causal mask kept for the whole pass;
* ``sdpa``: a batch-1 unpadded prompt goes to a fused causal kernel (no mask, no
  ``n²`` buffer). With an explicit mask (padding) torch may fall back to its math path,
  which costs what eager does: pass ``eager`` to plan for that;
* ``flash`` (flash-attention 2): tiled, nothing quadratic.

All three add the logits of every prompt position (``n x vocab``: the first forward
returns them all) and a layer's activations (hidden states and the MLP's gate/up
outputs). Requests decode with their caches held; their prefills may overlap, so the
worst case is every concurrent request's cache plus every one's prefill at once, the
best one prefill at a time. Checked against a measurement in tests/plan/test_worker.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.plan.config import ConfigError, ModelConfig
from proxy.plan.kv import DTYPE_BYTES, kv_bytes_for_tokens

__all__ = ["ATTENTION_IMPLEMENTATIONS", "PrefillCost", "prefill_cost"]

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash")


@dataclass(frozen=True)
class PrefillCost:
    """One request of ``tokens`` on a transformers worker (bytes; whole model, one card)."""

    tokens: int
    kv: int
    scores: int
    mask: int
    logits: int
    activations: int

    @property
    def transient(self) -> int:
        """What the prefill allocates on top of the request's cache, at its peak."""
        return self.scores + self.mask + self.logits + self.activations

    @property
    def single(self) -> int:
        return self.kv + self.transient

    def peak(self, concurrent: int, overlapping_prefills: int | None = None) -> int:
        """Peak above idle with ``concurrent`` requests; prefills overlapping at most as given.

        ``overlapping_prefills`` None means all of them (the worst case, what the advice
        uses); 1 is the serial case (prefills one at a time).
        """
        overlap = concurrent if overlapping_prefills is None else overlapping_prefills
        return concurrent * self.kv + min(concurrent, overlap) * self.transient


def prefill_cost(config: ModelConfig, tokens: int, implementation: str, dtype: str) -> PrefillCost:
    """The peak a prompt of ``tokens`` adds on a transformers worker running in ``dtype``."""
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError(
            "--attn-implementation",
            f"unknown {implementation!r} ({', '.join(ATTENTION_IMPLEMENTATIONS)})",
        )
    size = DTYPE_BYTES[dtype]
    n = tokens
    kv = kv_bytes_for_tokens(config, dtype, n)
    if config.attention == "mla":
        # transformers' DeepSeek-V2 caches the decompressed K and V of every head, not
        # vLLM's latent.
        per_token = config.qk_nope_head_dim + config.qk_rope_head_dim + config.mla_v_head_dim
        kv = config.num_layers * config.num_attention_heads * per_token * size * n
    quadratic = implementation == "eager"
    window = min(n, config.sliding_window or n)
    heads = config.num_attention_heads
    return PrefillCost(
        tokens=n,
        kv=kv,
        scores=heads * n * window * size if quadratic else 0,
        mask=n * n * size if quadratic else 0,
        logits=n * config.vocab_size * size,
        activations=(4 * config.hidden_size + 2 * config.intermediate_size) * n * size,
    )
