"""The simulated upstream's settings, and the knobs tests may turn at run time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Dialect = Literal["vllm", "fastchat"]
ErrorStyle = Literal["current", "legacy"]

# Knobs ``POST /_sim/config`` may change while the sim runs. Structural settings
# (dialect, KV geometry, record size) are fixed at start: changing them under
# running requests would make the accounting meaningless.
RUNTIME_KNOBS = frozenset(
    {
        "model",
        "max_model_len",
        "tokens_per_second",
        "completion_tokens",
        "delay_seconds",
        "prefill_tokens_per_second",
        "decode_batch_slowdown",
        "legacy_metrics",
        "error_style",
        "strict_model",
    }
)


#: ``--timing gpu-7b``: times shaped like a 7-8B model on one data-centre GPU, a few
#: times faster so that demos and tests stay quick: a fixed 20 ms before the first
#: token, prefill at 16k tokens/s, 100 tokens/s decode alone, each other running
#: sequence slowing a step by 1.5 % (64 running: about twice as slow).
TIMINGS: dict[str, dict[str, float]] = {
    "none": {
        "delay_seconds": 0.0,
        "prefill_tokens_per_second": 0.0,
        "tokens_per_second": 0.0,
        "decode_batch_slowdown": 0.0,
    },
    "gpu-7b": {
        "delay_seconds": 0.02,
        "prefill_tokens_per_second": 16000.0,
        "tokens_per_second": 100.0,
        "decode_batch_slowdown": 0.015,
    },
}


@dataclass
class SimConfig:
    """How the simulated server behaves.

    ``dialect`` picks whose wire format it speaks: ``vllm`` (vLLM's OpenAI server)
    or ``fastchat`` (FastChat 0.2.36's ``openai_api_server``).
    """

    dialect: Dialect = "vllm"
    model: str = "sim-model"
    #: Context window: prompt plus completion, in sim tokens (see ``tokenizer``).
    max_model_len: int = 4096
    #: Generation speed; 0 answers at once (benchmarks, most tests).
    tokens_per_second: float = 0.0
    #: Tokens every answer generates, unless ``max_tokens`` asks for fewer.
    completion_tokens: int = 16
    #: KV-cache geometry: ``kv_blocks`` blocks of ``block_size`` tokens each.
    kv_blocks: int = 2048
    block_size: int = 16
    #: Seconds to wait before the first byte of a generation answer: the fixed part
    #: of the time to first token (scheduling, the first forward pass).
    delay_seconds: float = 0.0
    #: Prefill speed: the uncached prompt tokens take ``uncached / rate`` seconds
    #: before the first token (and again when a preempted request is recomputed);
    #: 0 prefills at once.
    prefill_tokens_per_second: float = 0.0
    #: How the decode interval ``1 / tokens_per_second`` grows with the batch: each
    #: other running sequence adds this fraction of it (0.02: 50 running, twice as slow).
    decode_batch_slowdown: float = 0.0
    #: vLLM's automatic prefix caching (on by default in V1): full blocks of the
    #: prompt found in the cache are not prefilled again (``blocks.py``).
    prefix_caching: bool = True
    #: vLLM's admission: start on the prompt's blocks, grow a block at a time,
    #: preempt the newest sequence when none is free. Off: reserve the whole planned
    #: length up front and never preempt (``kv.py``).
    preempt: bool = False
    #: vLLM only: export ``vllm:gpu_cache_usage_perc`` (vLLM V0) instead of
    #: ``vllm:kv_cache_usage_perc`` (V1).
    legacy_metrics: bool = False
    #: vLLM only: ``current`` error bodies (``{"error": {...}}``, vLLM >= 0.10) or
    #: ``legacy`` (flat ``{"object": "error", ...}`` with the older wording).
    error_style: ErrorStyle = "current"
    #: Refuse models other than ``model`` the way the real server does (vLLM 404,
    #: FastChat 400/40301). Off by default so clients may send any model name.
    strict_model: bool = False
    #: How many received requests ``GET /_sim/requests`` keeps (oldest dropped).
    record_limit: int = 1000
    #: FastChat only: the system prompt its conversation template adds when the
    #: request has none (the qwen-7b-chat/ChatML template's default).
    fastchat_system_message: str = "You are a helpful assistant."
    #: The sim tokenizer's bytes of text per token (``proxy.sim.tokenizer``): sims with
    #: different values count the same prompt differently, like two models' tokenizers.
    bytes_per_token: int = 4
    #: Largest request body accepted, bytes.
    max_body_bytes: int = 64 * 1024 * 1024
    #: Require ``Authorization: Bearer <api_key>`` (401 otherwise), like vLLM's
    #: ``--api-key``, but on every route but ``/_sim/*`` and ``/health`` (vLLM guards
    #: ``/v1/*`` only): tests then prove that every call the proxy makes sends it.
    api_key: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.dialect not in ("vllm", "fastchat"):
            raise ValueError(f"dialect must be 'vllm' or 'fastchat', not {self.dialect!r}")
        if self.error_style not in ("current", "legacy"):
            raise ValueError(f"error_style must be 'current' or 'legacy', not {self.error_style!r}")
        positive = (
            "max_model_len",
            "kv_blocks",
            "block_size",
            "record_limit",
            "max_body_bytes",
            "bytes_per_token",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.completion_tokens < 0:
            raise ValueError("completion_tokens must be >= 0")
        rates = (
            "tokens_per_second",
            "delay_seconds",
            "prefill_tokens_per_second",
            "decode_batch_slowdown",
        )
        for name in rates:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.model:
            raise ValueError("model must not be empty")

    def prefill_seconds(self, tokens: int) -> float:
        rate = self.prefill_tokens_per_second
        return tokens / rate if rate > 0 and tokens > 0 else 0.0

    def decode_interval(self, running: int) -> float:
        """Seconds per generated token with ``running`` sequences in the batch."""
        if self.tokens_per_second <= 0:
            return 0.0
        return (1.0 + self.decode_batch_slowdown * max(0, running - 1)) / self.tokens_per_second

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, knobs: dict[str, Any]) -> SimConfig:
        """A copy with run-time knobs applied; unknown or fixed knobs are an error."""
        unknown = set(knobs) - RUNTIME_KNOBS
        if unknown:
            raise ValueError(f"not settable at run time: {', '.join(sorted(unknown))}")
        typed: dict[str, Any] = {}
        for name, value in knobs.items():
            current = getattr(self, name)
            # JSON gives ints for floats and the like; coerce to the field's type so
            # a bad value fails here, not in the middle of a request.
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{name} must be true or false")
                typed[name] = value
            elif isinstance(current, int | float) and isinstance(value, int | float):
                if isinstance(value, bool):
                    raise ValueError(f"{name} must be a number")
                if isinstance(current, int) and value != int(value):
                    raise ValueError(f"{name} must be a whole number")
                typed[name] = type(current)(value)
            elif isinstance(current, str) and isinstance(value, str):
                typed[name] = value
            else:
                raise ValueError(f"{name} must be a {type(current).__name__}")
        return dataclasses.replace(self, **typed)
