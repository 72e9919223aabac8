"""Injected time for tests of background loops: the test, not the wall clock, says
when a loop's sleep is over, so what a test counts does not depend on how busy the
machine is.

* ``SteppedSleep``: pass it as a loop's ``sleep``; each call records its delay and
  parks until the test lets it go with ``rounds(n)``.
"""

from __future__ import annotations

import asyncio

# How long a test waits for a loop to reach its next sleep before it fails: a hang
# guard, not a measurement.
PARK_TIMEOUT = 10.0


class SteppedSleep:
    """An async ``sleep(seconds)`` that returns when the test says so.

    ``slept`` holds every delay asked for, in order. ``parked()`` waits until the loop
    is in a sleep; ``rounds(n)`` lets it out ``n`` times, each time waiting for it to
    park again, so that exactly ``n`` more rounds of the loop have run.
    """

    def __init__(self) -> None:
        self.slept: list[float] = []
        self._parked = asyncio.Event()
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._parked.set()
        await self._go.get()

    async def parked(self) -> None:
        await asyncio.wait_for(self._parked.wait(), PARK_TIMEOUT)

    async def rounds(self, n: int = 1) -> None:
        for _ in range(n):
            await self.parked()
            self._parked.clear()
            self._go.put_nowait(None)
            await self.parked()
