"""A cache whose misses are fetched once: concurrent callers of a missing or expired
key share the one fetch in flight (single flight), and each value keeps for as long
as its fetch says. The served-model list and FastChat's context lengths use it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Flight(Generic[K, V]):
    """``get(key, fetch)``: the cached value while fresh, else ``fetch()``'s, shared
    with every caller that asks meanwhile; ``ttl(value)`` says how long it keeps."""

    def __init__(
        self, ttl: Callable[[V], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._clock = clock
        self._values: dict[K, tuple[V, float]] = {}
        self._pending: dict[K, asyncio.Future[V]] = {}

    def fresh(self, key: K) -> V | None:
        """The cached value while fresh, else None; no coroutine (``get`` is one)."""
        known = self._values.get(key)
        if known is not None and known[1] > self._clock():
            return known[0]
        return None

    async def get(self, key: K, fetch: Callable[[], Awaitable[V]]) -> V:
        now = self._clock()
        known = self._values.get(key)
        if known is not None and known[1] > now:
            return known[0]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            value = await fetch()
            self._values[key] = (value, now + self._ttl(value))
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            del self._pending[key]

    def keep_only(self, keys: set[K]) -> None:
        """Forget every value whose key is not in ``keys`` (what the upstream lists
        bounds what is kept)."""
        for gone in [k for k in self._values if k not in keys]:
            del self._values[gone]
