"""The response store in Redis, shared by every replica (docs/architecture.md §22).

One string key per turn, ``trimproxy:turn:<key>``, holding ``Stored.encode()`` (its
parent's key, a newline, the JSON) with the idle TTL (``PX``); one sorted set,
``trimproxy:turns``, of those keys by last use (a counter, ``trimproxy:turns:seq``,
orders the uses); a hash of each key's bytes (``trimproxy:turns:sizes``) and their
total (``trimproxy:turns:bytes``), for the bytes bound. Each call is one Lua script,
so one round trip and atomic across replicas: reading a chain walks the parent links
inside Redis and restarts each entry's idle time; a write past ``max_entries`` or
``max_bytes`` deletes the least recently used. An entry idle past the TTL is gone from
Redis and still in the line (its bytes still counted), but behind every entry used
since: it is the first the bounds take. Entries of the earlier layout
(``trimproxy:response:``, a whole chain each) are not read: their ids miss, and they
expire on their TTL.

As the session store (``proxy.sessions.redis_store``), a call has one short deadline,
and after a failure the store answers ``StoreUnavailable`` at once for
``retry_interval`` seconds before it tries again; the outage is logged when it starts
and when it ends, not per request. A write's deadline grows with its bytes, so one
client's large (bounded) entry on a slow link does not mark the store down for all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.chains.entry import Stored, turn_of
from proxy.chains.store import Chain, ChainBroken, ChainTooLong, StoreUnavailable
from proxy.redis_client import FAILURES, answers, connect

log = logging.getLogger("trimproxy.responses")

KEY_PREFIX = "trimproxy:turn:"
LINE = "trimproxy:turns"
SEQ = "trimproxy:turns:seq"
SIZES = "trimproxy:turns:sizes"
TOTAL = "trimproxy:turns:bytes"
#: The write throughput a deadline assumes beyond its base (bytes per second).
WRITE_RATE = 50 * 1024 * 1024

# KEYS: the entry, line, counter, sizes, total. ARGV: the entry's bytes, the TTL in ms,
# the most entries, the most bytes. Returns -1 when the key is taken, else how many
# entries the bounds deleted.
PUT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
local size = string.len(ARGV[1])
redis.call('HSET', KEYS[4], KEYS[1], size)
local total = redis.call('INCRBY', KEYS[5], size)
local deleted = 0
while redis.call('ZCARD', KEYS[2]) > tonumber(ARGV[3]) or total > tonumber(ARGV[4]) do
  local oldest = redis.call('ZPOPMIN', KEYS[2], 1)
  if #oldest == 0 then break end
  local held = tonumber(redis.call('HGET', KEYS[4], oldest[1]) or '0')
  redis.call('HDEL', KEYS[4], oldest[1])
  total = redis.call('DECRBY', KEYS[5], held)
  deleted = deleted + redis.call('DEL', oldest[1])
end
for i = 2, 5 do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
return deleted
"""

# KEYS: the entry, line, counter. ARGV: the TTL in ms. Returns the entry or nil.
GET_LUA = """
local value = redis.call('GETEX', KEYS[1], 'PX', ARGV[1])
if value then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[1])
end
return value
"""

# KEYS: the entry, line, counter. ARGV: the TTL in ms, the most bytes, the key prefix,
# the most entries. Returns {'ok', entry, parent, ...} (the asked one first),
# {'missing'}, {'broken'} or {'long'}. The parents' keys are read from the values
# (a standalone Redis: a cluster would need them in KEYS).
CHAIN_LUA = """
local out = {'ok'}
local held = {}
local key = KEYS[1]
local size = 0
local limit = tonumber(ARGV[2])
local most = tonumber(ARGV[4])
while key do
  local value = redis.call('GET', key)
  if not value then
    if #out == 1 then return {'missing'} end
    return {'broken'}
  end
  size = size + string.len(value)
  if size > limit or #held >= most then return {'long'} end
  out[#out + 1] = value
  held[#held + 1] = key
  local parent = string.sub(value, 1, string.find(value, '\\n', 1, true) - 1)
  if parent == '' then key = nil else key = ARGV[3] .. parent end
end
for i = #held, 1, -1 do
  redis.call('PEXPIRE', held[i], ARGV[1])
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), held[i])
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return out
"""

# KEYS: the entry, line, sizes, total. Returns 1 when there was an entry.
DELETE_LUA = """
redis.call('ZREM', KEYS[2], KEYS[1])
local held = redis.call('HGET', KEYS[3], KEYS[1])
if held then
  redis.call('HDEL', KEYS[3], KEYS[1])
  redis.call('DECRBY', KEYS[4], tonumber(held))
end
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
        max_bytes: int = 256 * 1024 * 1024,
        timeout: float = 0.5,
        max_connections: int = 64,
        retry_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.target = connect(url, timeout, max_connections)
        self.ttl_ms = max(1, round(ttl * 1000))
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._get = self.client.register_script(GET_LUA)
        self._chain = self.client.register_script(CHAIN_LUA)
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

    async def chain(self, key: str, max_bytes: int) -> Chain | None:
        keys = [KEY_PREFIX + key, LINE, SEQ]
        args: list[int | str] = [self.ttl_ms, max_bytes, KEY_PREFIX, self.max_entries]
        # The chain is bounded by max_bytes: its deadline grows with that bound.
        answer = await self._call(lambda: self._chain(keys=keys, args=args), max_bytes)
        status = answer[0] if isinstance(answer, list) and answer else b"missing"
        if status == b"missing":
            return None
        if status == b"broken":
            raise ChainBroken(key)
        if status == b"long":
            raise ChainTooLong(key)
        raws = [raw for raw in answer[1:] if isinstance(raw, bytes)]
        entries = [turn_of(raw) for raw in reversed(raws)]
        return Chain([e for e in entries if e is not None], sum(map(len, raws)))

    async def put(self, key: str, raw: bytes) -> bool:
        keys = [KEY_PREFIX + key, LINE, SEQ, SIZES, TOTAL]
        args: list[bytes | int] = [raw, self.ttl_ms, self.max_entries, self.max_bytes]
        deleted = await self._call(lambda: self._put(keys=keys, args=args), len(raw))
        return bool(deleted != -1)

    async def delete(self, key: str) -> bool:
        keys = [KEY_PREFIX + key, LINE, SIZES, TOTAL]
        return bool(await self._call(lambda: self._delete(keys=keys)))

    async def _call(self, command: Callable[[], Awaitable[T]], size: int = 0) -> T:
        if self.down_since is not None and self.clock() < self.retry_at:
            raise StoreUnavailable(self.target)
        try:
            # redis-py drops a connection whose read was cancelled, so a late reply
            # never lands on the next command.
            async with asyncio.timeout(self.timeout + size / WRITE_RATE):
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

    def held(self) -> tuple[int, int] | None:
        return None  # shared state: the gauge of one replica would mislead

    async def ping(self) -> bool:
        return await answers(self.client, self.timeout)

    async def aclose(self) -> None:
        await self.client.aclose()
