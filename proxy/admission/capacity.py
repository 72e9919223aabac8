"""The engine's KV capacity: from the setting, or read off vLLM's ``/metrics``.

vLLM publishes its cache configuration as an info gauge whose labels carry the
figures, one series per engine (data-parallel ranks each have their own cache)::

    vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2043",...} 1.0

Newer releases carry ``kv_cache_size_tokens`` (group-aware, so right for hybrid models
too); otherwise the capacity is ``num_gpu_blocks * block_size``. One block is taken off
either: vLLM V1's block pool keeps it for itself from start-up (its "null block", never
handed to a request). Engines are summed: the
proxy's ledger stands for the whole upstream behind one URL. The block size comes along
so that reservations can be rounded up to whole blocks, the unit vLLM allocates in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.vllm_metrics import cache_config_labels


@dataclass(frozen=True, slots=True)
class Capacity:
    tokens: int
    """The tokens the ledger may hand out (the engine's capacity times the fraction)."""
    block_size: int = 1
    """Reservations are rounded up to a multiple of this (vLLM's paged blocks)."""

    def charge(self, tokens: int) -> int:
        """What a request of ``tokens`` costs: whole blocks, at most the whole capacity.

        A request larger than the capacity is charged all of it, so it runs alone
        (see docs/admission.md) and ``reserved ≤ capacity`` holds, but for answers that
        outgrew their reservation (``Reservation.grow``).
        """
        rounded = -(-max(tokens, 0) // self.block_size) * self.block_size
        return min(rounded, self.tokens)


@dataclass(frozen=True, slots=True)
class EngineCache:
    """What the engine reports: KV tokens over all its engines, and the block size."""

    tokens: int
    block_size: int
    shares_prompt: bool = True
    """Prefix caching is on (vLLM's default; ``enable_prefix_caching="False"`` turns it
    off): the ``n`` answers of one request share its prompt's full blocks."""


def parse_cache_config(text: str) -> EngineCache | None:
    """The engine's KV-cache size from a ``/metrics`` body; None when it says nothing.

    The labels come from ``vllm_metrics.cache_config_labels`` (a line scan: the body
    can be hundreds of KB of histograms).
    """
    total = 0
    block = 0
    found = False
    shares = True
    for labels in cache_config_labels(text):
        size = _positive_int(labels.get("block_size"))
        tokens = _positive_int(labels.get("kv_cache_size_tokens"))
        if tokens is None:
            blocks = _positive_int(labels.get("num_gpu_blocks"))
            if blocks is None or size is None:
                continue
            tokens = blocks * size
        # Both figures count the null block (vLLM 0.32's kv_cache_size_tokens is
        # num_blocks / blocks_per_request x max_model_len): it is not the requests'.
        tokens -= size or 0
        total += tokens
        block = max(block, size or 1)
        shares = shares and labels.get("enable_prefix_caching") != "False"
        found = True
    return EngineCache(total, block, shares) if found else None


def _positive_int(value: str | None) -> int | None:
    """``"2043"`` → 2043; vLLM writes unset figures as ``None``, and floats as ``2043.0``."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or number < 1:
        return None
    return int(number)


def scaled(engine_tokens: int, fraction: float, block_size: int = 1) -> Capacity:
    """The ledger's capacity: the engine's tokens times the fraction, whole blocks."""
    tokens = math.floor(engine_tokens * fraction)
    if block_size > 1:
        tokens -= tokens % block_size
    return Capacity(max(tokens, block_size), block_size)
