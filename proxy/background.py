"""One background task of the app: the engine prober, a ``/metrics`` scraper, DNS
re-resolution. Each is a loop that runs until the lifespan (or the fleet, for an engine
that leaves) stops it.

``start`` creates the task, named for ``asyncio``'s task dumps; ``stop`` cancels it and
waits for it to end. Both may be called again: ``start`` while the task runs starts
nothing, ``stop`` with no task does nothing. A loop that ends by an exception
(a bug: each loop catches what it expects) is logged when it ends, not when it is
stopped, so the log says when it happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

Work = Callable[[], Coroutine[Any, Any, None]]


class Background:
    """The task that runs ``work()``, started and stopped by its owner; an unexpected
    end is logged to ``log``."""

    def __init__(self, name: str, work: Work, log: logging.Logger) -> None:
        self.name = name
        self._work = work
        self._log = log
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.create_task(self._work(), name=self.name)
            self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended. Cancelling ``stop`` itself is
        not swallowed: it leaves the task cancelled, ending on its own."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait() neither raises the task's CancelledError nor its exception (the
        # done callback has logged that one).
        await asyncio.wait([task])

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()  # also marks it retrieved: asyncio says nothing more
        if error is not None:
            self._log.error("%s ended unexpectedly", self.name, exc_info=error)
