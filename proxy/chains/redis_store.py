"""The response store in Redis, shared by every replica (docs/architecture.md §22).

One string key per response, ``trimproxy:response:<key>``, holding ``Stored.encode()``
with the idle TTL (``PX``), and one sorted set, ``trimproxy:responses``, of those keys
by last use (a counter, ``trimproxy:responses:seq``, orders the uses). Each call is one
Lua script, so one round trip and atomic across replicas: a read (``GETEX ... PX``)
restarts the entry's idle time and moves it to the end of the line; a write past
``max_entries`` deletes the least recently used. An entry idle past the TTL is gone
from Redis and still in the line, but behind every entry used since: it is the first
the bound takes, so the line never holds more than ``max_entries``.

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
LINE = "trimproxy:responses"
SEQ = "trimproxy:responses:seq"

# KEYS: the entry, the line, the counter. ARGV: the entry's bytes, the TTL in ms, the
# most entries. Returns how many entries the bound deleted.
PUT_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
local deleted = 0
if over > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #oldest, 2 do deleted = deleted + redis.call('DEL', oldest[i]) end
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return deleted
"""

# KEYS: the entry, the line, the counter. ARGV: the TTL in ms. Returns the entry or nil.
GET_LUA = """
local value = redis.call('GETEX', KEYS[1], 'PX', ARGV[1])
if value then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[1])
end
return value
"""

# KEYS: the entry, the line. Returns 1 when there was an entry.
DELETE_LUA = """
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
"""

T = TypeVar("T")


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        ttl: float,
        max_entries: int,
        *,
        timeout: float = 0.5,
        max_connections: int = 64,
        retry_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.target = connect(url, timeout, max_connections)
        self.ttl_ms = max(1, round(ttl * 1000))
        self.max_entries = max_entries
        self._get = self.client.register_script(GET_LUA)
        self._put = self.client.register_script(PUT_LUA)
        self._delete = self.client.register_script(DELETE_LUA)
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.clock = clock
        self.down_since: float | None = None
        self.retry_at = 0.0

    async def get(self, key: str) -> Stored | None:
        keys = [KEY_PREFIX + key, LINE, SEQ]
        raw = await self._call(lambda: self._get(keys=keys, args=[self.ttl_ms]))
        return Stored.decode(raw) if isinstance(raw, bytes) else None

    async def put(self, key: str, stored: Stored) -> None:
        keys = [KEY_PREFIX + key, LINE, SEQ]
        args: list[bytes | int] = [stored.encode(), self.ttl_ms, self.max_entries]
        await self._call(lambda: self._put(keys=keys, args=args))

    async def delete(self, key: str) -> bool:
        keys = [KEY_PREFIX + key, LINE]
        return bool(await self._call(lambda: self._delete(keys=keys)))

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
                    self.target,
                    type(exc).__name__,
                    self.retry_interval,
                )
            raise StoreUnavailable(self.target) from exc
        if self.down_since is not None:
            log.warning(
                "response store %s is back after %.1f s",
                self.target,
                self.clock() - self.down_since,
            )
            self.down_since = None
        return result

    def held(self) -> int | None:
        return None  # shared state: the gauge of one replica would mislead

    async def ping(self) -> bool:
        return await answers(self.client, self.timeout)

    async def aclose(self) -> None:
        await self.client.aclose()
