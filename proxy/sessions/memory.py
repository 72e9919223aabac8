"""The per-process session store: the default when no Redis is configured."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.sessions.identity import ConversationHashes
from proxy.sessions.rule import Decision, Limits, State, decide


class MemoryStore:
    """Per-process store, bounded by count (LRU) and by idle time.

    ``admit`` has no ``await`` between read and write, so on one event loop it is
    atomic. With several workers each has its own view: use Redis there. ``clock``
    is injectable so that tests can age sessions without sleeping.
    """

    name = "memory"

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        # key -> (state, last use); ordered by last use, oldest first.
        self._entries: OrderedDict[str, tuple[State, float]] = OrderedDict()

    async def admit(self, key: str, hashes: ConversationHashes, limits: Limits) -> Decision:
        now = self.clock()
        self._expire(now, limits.idle_ttl)
        held = self._entries.pop(key, None)
        state, decision = decide(held[0] if held else None, hashes, limits, now)
        self._entries[key] = (state, now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return decision

    def _expire(self, now: float, ttl: float) -> None:
        # Oldest use first: stop at the first entry still alive.
        while self._entries:
            key, (_, last) = next(iter(self._entries.items()))
            if now - last <= ttl:
                break
            del self._entries[key]

    def state(self, key: str) -> State | None:
        held = self._entries.get(key)
        return held[0] if held else None

    def held(self) -> int | None:
        return len(self._entries)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
