"""The sim's sense of time, injectable so tests can measure it exactly.

``WallClock`` is the real one. ``StepClock`` (tests) jumps ahead by whatever a
sleep asks instead of waiting, so a test reads the sim's time to first token
(``ttft_seconds`` in ``/_sim/requests``) as the configured model says it, with no
wall-clock jitter and no waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class StepClock:
    """Time that moves only when the sim sleeps, by exactly as long as it sleeps."""

    def __init__(self) -> None:
        self._now = 0.0

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)  # still yield, as a real sleep would
