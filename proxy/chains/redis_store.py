"""The response store in Redis, shared by every replica (docs/architecture.md §22).

One string key per response, ``trimproxy:response:<key>``, holding ``Stored.encode()``
with the idle TTL (``PX``); a read is ``GETEX ... PX`` (one round trip that restarts
the idle time), so a chain in use stays while an abandoned one goes. Redis bounds the
entries by memory (its ``maxmemory`` policy), trimproxy by the TTL.

As the session store (``proxy.sessions.redis_store``), a call has one short deadline,
and after a failure the store answers ``StoreUnavailable`` at once for
``retry_interval`` seconds before it tries again; the outage is logged when it starts
and when it ends, not per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.chains.entry import Stored
from proxy.chains.store import StoreUnavailable
from proxy.redis_client import FAILURES, answers, connect

log = logging.getLogger("trimproxy.responses")

KEY_PREFIX = "trimproxy:response:"

T = TypeVar("T")


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        ttl: float,
        *,
        timeout: float = 0.5,
        max_connections: int = 64,
        retry_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.target = connect(url, timeout, max_connections)
        self.ttl_ms = max(1, round(ttl * 1000))
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.clock = clock
        self.down_since: float | None = None
        self.retry_at = 0.0

    async def get(self, key: str) -> Stored | None:
        raw = await self._call(lambda: self.client.getex(KEY_PREFIX + key, px=self.ttl_ms))
        return Stored.decode(raw) if isinstance(raw, bytes) else None

    async def put(self, key: str, stored: Stored) -> None:
        data = stored.encode()
        await self._call(lambda: self.client.set(KEY_PREFIX + key, data, px=self.ttl_ms))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(lambda: self.client.delete(KEY_PREFIX + key)))

    async def _call(self, command: Callable[[], Awaitable[T]]) -> T:
        if self.down_since is not None and self.clock() < self.retry_at:
            raise StoreUnavailable(self.target)
        try:
            # redis-py drops a connection whose read was cancelled, so a late reply
            # never lands on the next command.
            async with asyncio.timeout(self.timeout):
                result = await command()
        except FAILURES as exc:
            now = self.clock()
            self.retry_at = now + self.retry_interval
            if self.down_since is None:
                self.down_since = now
                log.warning(
                    "response store %s unavailable (%s); previous_response_id and "
                    "GET/DELETE /v1/responses/{id} answer 503, retrying every %g s",
                    self.target, type(exc).__name__, self.retry_interval,
                )  # fmt: skip
            raise StoreUnavailable(self.target) from exc
        if self.down_since is not None:
            log.warning("response store %s is back after %.1f s", self.target,
                        self.clock() - self.down_since)  # fmt: skip
            self.down_since = None
        return result

    def held(self) -> int | None:
        return None  # shared state: the gauge of one replica would mislead

    async def ping(self) -> bool:
        return await answers(self.client, self.timeout)

    async def aclose(self) -> None:
        await self.client.aclose()
