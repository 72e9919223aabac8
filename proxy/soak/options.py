"""The settings of one soak run, as the command's flags give them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ArmName = Literal["target", "compare"]

#: Seconds between two samples of the engine's /metrics.
SAMPLE_INTERVAL = 0.5


def api_root(url: str) -> str:
    """``http://host:port`` from a root URL or one ending in ``/v1`` (both are common)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


@dataclass(frozen=True, slots=True)
class Arm:
    """One pass of the seeded load against one URL."""

    name: ArmName
    url: str
    index: int


@dataclass(frozen=True, slots=True)
class SoakOptions:
    target: str
    model: str
    compare: str | None = None
    conversations: int = 8
    turn_tokens: int = 200
    max_tokens: int = 64
    #: Seconds per arm; ``None`` when ``turns`` bounds the run instead.
    duration: float | None = 600.0
    #: Requests per conversation lane; ``None`` when ``duration`` bounds the run.
    turns: int | None = None
    metrics_url: str | None = None
    #: ``--engine-metrics``: each engine's ``/metrics`` page, for several engines.
    engine_metrics: tuple[str, ...] = ()
    session_header: str = "X-Session-ID"
    out: Path = Path("soak")
    max_kv_usage: float | None = None
    seed: int = 0
    api_key: str | None = None
    #: Read timeout for one answer, seconds.
    request_timeout: float = 600.0

    def arms(self) -> list[Arm]:
        arms = [Arm("target", api_root(self.target), 0)]
        if self.compare:
            arms.append(Arm("compare", api_root(self.compare), 1))
        return arms

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def describe(self) -> dict[str, object]:
        """What the report shows about the run (never the API key)."""
        return {
            "target": api_root(self.target),
            "compare": api_root(self.compare) if self.compare else None,
            "model": self.model,
            "conversations": self.conversations,
            "turn_tokens": self.turn_tokens,
            "max_tokens": self.max_tokens,
            "duration": self.duration,
            "turns": self.turns,
            "session_header": self.session_header,
            "seed": self.seed,
            "max_kv_usage": self.max_kv_usage,
        }
