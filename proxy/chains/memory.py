"""The per-process response store: the default when no Redis is configured."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.chains.entry import Stored


class MemoryStore:
    """Bounded by entries (the least recently used goes first) and by idle time.

    Each call runs without an ``await``, so on one event loop it is atomic. With
    several workers each holds its own responses: use Redis there. ``clock`` is
    injectable so that tests can age entries without sleeping.
    """

    name = "memory"

    def __init__(
        self, max_entries: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self.clock = clock
        # key -> (entry, last use); ordered by last use, oldest first.
        self._entries: OrderedDict[str, tuple[Stored, float]] = OrderedDict()

    async def get(self, key: str) -> Stored | None:
        now = self._expire()
        held = self._entries.pop(key, None)
        if held is None:
            return None
        self._entries[key] = (held[0], now)
        return held[0]

    async def put(self, key: str, stored: Stored) -> None:
        now = self._expire()
        self._entries.pop(key, None)
        self._entries[key] = (stored, now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def delete(self, key: str) -> bool:
        self._expire()
        return self._entries.pop(key, None) is not None

    def _expire(self) -> float:
        now = self.clock()
        # Oldest use first: stop at the first entry still alive.
        while self._entries:
            key, (_, last) = next(iter(self._entries.items()))
            if now - last <= self.ttl:
                break
            del self._entries[key]
        return now

    def held(self) -> int | None:
        return len(self._entries)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
