"""A least-recently-used map bounded by the memory its keys take.

Counts are small; the keys (rendered text runs, message digests) are what grows,
so the bound is on bytes, not entries: a cache of 10,000 short runs and one of
ten 100 kB messages should cost what they weigh.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K", str, bytes)
V = TypeVar("V")

# dict slot, the OrderedDict link and the boxed value, roughly; only the order of
# magnitude matters for a memory bound.
ENTRY_OVERHEAD = 120


class ByteLRU(Generic[K, V]):
    """Not thread-safe: it is touched from the event loop only."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    @staticmethod
    def weigh(key: K) -> int:
        # getsizeof is O(1) and counts the real storage: 1, 2 or 4 bytes a character.
        return sys.getsizeof(key) + ENTRY_OVERHEAD

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def lookups(self) -> tuple[Callable[[K], V | None], Callable[[K], None]]:
        """``get`` taken apart: the map's own lookup and its move-to-newest, both C
        calls, for a loop that binds them once, touches each hit itself and adds its
        counts to ``hits`` and ``misses``. A Python call per key costs more than the
        lookup it wraps (docs/performance.md §6)."""
        return self._data.get, self._data.move_to_end

    def put(self, key: K, value: V) -> None:
        self._add(key, value)
        self._shrink()

    def put_many(self, pairs: list[tuple[K, V]]) -> None:
        """``put`` of each pair, counted as misses: one call for a loop's new keys, the
        eviction done once at the end (docs/performance.md §6)."""
        for key, value in pairs:
            self._add(key, value)
        self.misses += len(pairs)
        self._shrink()

    def _add(self, key: K, value: V) -> None:
        weight = self.weigh(key)
        if weight > self.max_bytes:
            return  # larger than the whole budget: not worth evicting everything for
        if self._data.pop(key, None) is not None:
            self.bytes -= weight
        self._data[key] = value
        self.bytes += weight

    def _shrink(self) -> None:
        """The oldest entries out until the map is within its bytes."""
        while self.bytes > self.max_bytes:
            evicted, _ = self._data.popitem(last=False)
            self.bytes -= self.weigh(evicted)

    def clear(self) -> None:
        self._data.clear()
        self.bytes = 0
