"""What a soak run writes down: one record per request, one sample per half second.

Both are plain dataclasses that become one JSON line each (``requests.jsonl``,
``samples.jsonl``); the summary and the report read them back from memory or from
those files. A value the server did not report is ``None`` (``null``), never a guess;
``gpu_memory_used_mib`` is left out of a sample entirely where there is no
``nvidia-smi``, ``engines`` where no engine's ``/metrics`` is sampled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class RequestRecord:
    arm: str
    conversation: int
    """The lane: one of ``--conversations`` clients."""
    restart: int
    """How many times this lane started a new conversation after an error."""
    turn: int
    """1-based user turn within the lane's current conversation."""
    start: float
    """Seconds since the arm started."""
    status: int | None
    error: str | None
    error_key: str | None
    sent_prompt_tokens: int | None
    """The client's whole history: the target's ``/tokenize`` count where the target is a
    trimproxy, the engine's ``usage`` where the target is the engine itself."""
    forwarded_prompt_tokens: int | None
    """What reached the engine: trimproxy's ``X-Trimproxy-Prompt-Tokens``, else usage."""
    usage_prompt_tokens: int | None
    completion_tokens: int | None
    latency_seconds: float
    ttft_seconds: float | None
    session_id: str
    session_turn: int | None = None
    session_reset: bool = False
    trimmed_messages: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


#: One engine at one sample: ``kv_usage``, ``running``, ``waiting``,
#: ``preemptions_total``, ``prefix_cache_hits_total``, ``prefix_cache_queries_total``
#: (``None`` where the engine does not report one), or ``error`` alone.
EngineFigures = dict[str, Any]

ENGINE_FIELDS = (
    "kv_usage",
    "running",
    "waiting",
    "preemptions_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
)


@dataclass(frozen=True, slots=True)
class Sample:
    arm: str
    t: float
    """Seconds since the arm started."""
    unix: float
    kv_usage: float | None = None
    """The engine's KV-cache usage, 0..1 (the fullest engine where there are several)."""
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    gpu_memory_used_mib: list[float] | None = None
    """Per card, from ``nvidia-smi``; ``None`` (absent from the file) without one."""
    error: str | None = None
    """Why this sample has no engine figures (the scrape failed), or which engines'
    scrapes failed where others answered."""
    engines: dict[str, EngineFigures] | None = None
    """Each engine's own figures, by ``host:port`` (the proxy's ``engine`` label); the
    fields above are their sums (KV usage: the fullest engine)."""

    def to_json(self) -> bytes:
        data = dataclasses.asdict(self)
        if self.gpu_memory_used_mib is None:
            del data["gpu_memory_used_mib"]  # absent, not faked
        if self.engines is None:
            del data["engines"]
        return orjson.dumps(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
