"""The per-process response store: the default when no Redis is configured."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.chains.entry import Stored, parent_of, turn_of
from proxy.chains.store import Chain, ChainBroken, ChainTooLong


class MemoryStore:
    """Bounded by entries and by bytes (the least recently used goes first) and by
    idle time.

    Entries are held encoded, so the bytes bound is what the process holds (a
    decoded entry takes several times its JSON). Each call runs without an
    ``await``, so on one event loop it is atomic. With several workers each holds its
    own responses: use Redis there. ``clock`` is injectable so that tests can age
    entries without sleeping.
    """

    name = "memory"

    def __init__(
        self,
        max_entries: int,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.clock = clock
        # key -> (encoded entry, last use); ordered by last use, oldest first.
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0

    async def get(self, key: str) -> Stored | None:
        raw = self._touch(key, self._expire())
        return None if raw is None else Stored.decode(raw)

    async def chain(self, key: str, max_bytes: int) -> Chain | None:
        now = self._expire()
        found: list[bytes] = []
        size = 0
        at: str | None = key
        while at is not None:
            raw = self._touch(at, now)
            if raw is None:
                if not found:
                    return None
                raise ChainBroken(at)
            size += len(raw)
            if size > max_bytes or len(found) >= self.max_entries:
                raise ChainTooLong(key)
            found.append(raw)
            at = parent_of(raw)
        entries = [turn_of(raw) for raw in reversed(found)]
        return Chain([e for e in entries if e is not None], size)

    async def put(self, key: str, raw: bytes) -> bool:
        now = self._expire()
        if key in self._entries:
            return False
        self._entries[key] = (raw, now)
        self._bytes += len(raw)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    async def delete(self, key: str) -> bool:
        self._expire()
        if key not in self._entries:
            return False
        self._drop(key)
        return True

    def _touch(self, key: str, now: float) -> bytes | None:
        held = self._entries.pop(key, None)
        if held is None:
            return None
        self._entries[key] = (held[0], now)
        return held[0]

    def _drop(self, key: str) -> None:
        raw, _ = self._entries.pop(key)
        self._bytes -= len(raw)

    def _expire(self) -> float:
        now = self.clock()
        # Oldest use first: stop at the first entry still alive.
        while self._entries:
            key, (_, last) = next(iter(self._entries.items()))
            if now - last <= self.ttl:
                break
            self._drop(key)
        return now

    def held(self) -> tuple[int, int] | None:
        return len(self._entries), self._bytes

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
        self._bytes = 0
