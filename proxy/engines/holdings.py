"""Which engine holds each recent session: the load that ``session`` routing bounds.

An engine keeps a conversation's prefix in its cache between turns, whether or not a
request of it is in flight; so the load that matters for the prefix cache is how many
sessions an engine holds, not how many requests it serves this instant. A session is
held by the engine its last request went to until it has been idle ``idle`` seconds
(about as long as an engine's cache keeps an idle conversation's blocks). See
docs/architecture.md §20 and docs/engines.md.

``Holdings`` is the Protocol; ``MemoryHoldings`` keeps them in this process (each proxy
replica bounds the sessions it has seen).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Protocol


class Holdings(Protocol):
    def engine_of(self, key: str) -> str | None:
        """The engine (URL) that holds ``key``, or None (new, or idle too long)."""
        ...

    def held(self, engine: str) -> int:
        """How many sessions ``engine`` holds."""
        ...

    def sessions(self) -> int:
        """How many sessions are held, by any engine (those of an engine that left too:
        they come to the others next)."""
        ...

    def hold(self, key: str, engine: str) -> None:
        """``key``'s request goes to ``engine``: it holds the session from now."""
        ...


class MemoryHoldings:
    """Holdings in this process: sessions by last use, at most ``limit`` of them."""

    def __init__(
        self, idle: float, limit: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.idle = idle
        self.limit = limit
        self._clock = clock
        self._where: OrderedDict[str, tuple[str, float]] = OrderedDict()
        """Session key -> (engine, last use), least recently used first."""
        self._count: Counter[str] = Counter()

    def sessions(self) -> int:
        self._expire(self._clock())
        return len(self._where)

    def engine_of(self, key: str) -> str | None:
        self._expire(self._clock())
        held = self._where.get(key)
        return None if held is None else held[0]

    def held(self, engine: str) -> int:
        self._expire(self._clock())
        return self._count[engine]

    def hold(self, key: str, engine: str) -> None:
        now = self._clock()
        before = self._where.pop(key, None)
        if before is not None:
            self._count[before[0]] -= 1
        self._where[key] = (engine, now)
        self._count[engine] += 1
        while len(self._where) > self.limit:
            self._drop()

    def _expire(self, now: float) -> None:
        # Oldest first: stop at the first session used within the window.
        while self._where and now - next(iter(self._where.values()))[1] > self.idle:
            self._drop()

    def _drop(self) -> None:
        _key, (engine, _seen) = self._where.popitem(last=False)
        self._count[engine] -= 1
        if not self._count[engine]:
            del self._count[engine]
