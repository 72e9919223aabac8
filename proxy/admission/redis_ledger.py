"""The ledger shared by every worker and replica through Redis (docs/architecture.md §11, §18).

Keys, per upstream (``ns`` is a hash of its URL, so engines never share a ledger)::

    trimproxy:kv:<ns>:queue   ZSET  ticket -> arrival number (the FIFO line)
    trimproxy:kv:<ns>:alive   HASH  ticket -> ms until which a waiter counts as alive
    trimproxy:kv:<ns>:leases  ZSET  ticket -> ms at which the reservation expires
    trimproxy:kv:<ns>:tokens  HASH  ticket -> tokens reserved
    trimproxy:kv:<ns>:seq     the arrival counter

``ACQUIRE`` is one Lua script, so every replica sees one order: it drops expired leases
(a replica that died holds nothing for longer than the lease) and dead waiters at the
head of the line (a replica that died while waiting blocks nobody for longer than
``waiter_ttl``), puts the ticket in line if it is new, and grants it when it is at the
head and fits. A waiter asks again every ``poll_interval`` (at once when a
reservation of this process ends). Time is Redis's ``TIME``, so replicas with skewed
clocks agree. Live leases are refreshed every ``lease_ttl / 3`` by one background task,
so a stream that runs for an hour keeps its reservation. ``GROW`` adds to a reservation
whose streamed answer outgrew it (never to one whose lease has gone).

When Redis fails, ``RedisLedger`` answers from ``fallback``, a per-process
``MemoryLedger`` with this process's share of the capacity, for ``retry_interval``
seconds before it asks Redis again — or, with TRIMPROXY_SESSION_STORE_FAILURE=closed,
raises ``LedgerUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Literal

from proxy.admission.capacity import Capacity
from proxy.admission.ledger import (
    AdmissionTimeout,
    LedgerUnavailable,
    MemoryLedger,
    Reservation,
    unmetered,
)
from proxy.redis_client import FAILURES, answers, connect

log = logging.getLogger("trimproxy.admission")

# KEYS: queue, alive, leases, tokens, seq. ARGV: ticket, charge, capacity, lease ms,
# waiter ms. Returns {granted (0/1), tokens reserved, place in line (0 = head)}.
ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ticket, charge, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[3], dead)
  redis.call('HDEL', KEYS[4], dead)
end
local reserved = 0
for _, v in ipairs(redis.call('HVALS', KEYS[4])) do reserved = reserved + tonumber(v) end
if redis.call('ZSCORE', KEYS[1], ticket) == false then
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[5]), ticket)
end
redis.call('HSET', KEYS[2], ticket, now + tonumber(ARGV[5]))
while true do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if head == nil or head == ticket then break end
  local alive = tonumber(redis.call('HGET', KEYS[2], head) or '0')
  if alive >= now then break end
  redis.call('ZREM', KEYS[1], head)
  redis.call('HDEL', KEYS[2], head)
end
local place = redis.call('ZRANK', KEYS[1], ticket)
if place == 0 and reserved + charge <= cap then
  redis.call('ZREM', KEYS[1], ticket)
  redis.call('HDEL', KEYS[2], ticket)
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ticket)
  redis.call('HSET', KEYS[4], ticket, charge)
  return {1, reserved + charge, 0}
end
return {0, reserved, place}
"""

# KEYS: queue, alive, leases, tokens. ARGV: tickets. Leaves the line or the ledger.
RELEASE_LUA = """
for _, ticket in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], ticket)
  redis.call('HDEL', KEYS[2], ticket)
  redis.call('ZREM', KEYS[3], ticket)
  redis.call('HDEL', KEYS[4], ticket)
end
return 0
"""

# KEYS: tokens. ARGV: ticket, tokens. Adds to a reservation still held (an expired
# lease is not brought back); returns 1 if it was.
GROW_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: leases, tokens. ARGV: lease ms, tickets. Extends the leases still held;
# returns how many were gone (expired while Redis was unreachable).
REFRESH_LUA = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lost = 0
for i = 2, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[1], until_ms, ARGV[i])
  else
    lost = lost + 1
  end
end
return lost
"""


def namespace(upstream_url: str) -> str:
    return hashlib.sha256(upstream_url.encode()).hexdigest()[:16]


class RedisLedger:
    name = "redis"

    def __init__(
        self,
        url: str,
        upstream_url: str,
        fallback: MemoryLedger,
        *,
        share: int = 1,
        failure: Literal["open", "closed"] = "open",
        lease_ttl: float = 15.0,
        waiter_ttl: float = 2.0,
        poll_interval: float = 0.05,
        timeout: float = 0.5,
        retry_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.target = connect(url, timeout)
        prefix = f"trimproxy:kv:{namespace(upstream_url)}:"
        self.keys = [prefix + k for k in ("queue", "alive", "leases", "tokens", "seq")]
        self._acquire = self.client.register_script(ACQUIRE_LUA)
        self._release = self.client.register_script(RELEASE_LUA)
        self._refresh = self.client.register_script(REFRESH_LUA)
        self._grow = self.client.register_script(GROW_LUA)
        self.fallback = fallback
        self.share = share
        self.failure = failure
        self.lease_ttl = lease_ttl
        self.waiter_ttl = waiter_ttl
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.clock = clock
        self._capacity: Capacity | None = None
        self._held: dict[str, int] = {}  # this process's tickets and their charges
        self._serial = 0
        self._prefix = f"{os.getpid()}-{os.urandom(4).hex()}-"
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self.down_since: float | None = None
        self._retry_at = 0.0

    @property
    def capacity(self) -> Capacity | None:
        return self._capacity

    def set_capacity(self, capacity: Capacity | None) -> None:
        self._capacity = capacity
        share = None
        if capacity is not None:
            per_process = max(capacity.tokens // self.share, capacity.block_size)
            share = Capacity(per_process, capacity.block_size)
        self.fallback.set_capacity(share)
        self._changed.set()

    def local_reserved(self) -> int:
        return sum(self._held.values()) + self.fallback.local_reserved()

    async def reserve(self, tokens: int, timeout: float) -> Reservation:
        capacity = self._capacity
        if capacity is None:
            return unmetered()
        started = self.clock()
        if self.down_since is not None and started < self._retry_at:
            return await self._degraded(tokens, timeout)
        self._serial += 1
        ticket = f"{self._prefix}{self._serial}"
        deadline = started + timeout
        charge = capacity.charge(tokens)
        polls = 0
        try:
            while True:
                args = (ticket, charge, capacity.tokens, _ms(self.lease_ttl), _ms(self.waiter_ttl))
                self._changed.clear()
                async with asyncio.timeout(self.timeout):
                    granted, reserved, place = await self._acquire(keys=self.keys, args=args)
                if granted:
                    self._recovered()
                    self._held[ticket] = charge
                    self._ensure_refresher()
                    waited = self.clock() - started if polls else 0.0
                    return Reservation(
                        charge, waited, self._on_release(ticket), self._on_grow(ticket)
                    )
                polls += 1
                left = deadline - self.clock()
                if left <= 0:
                    self._spawn(self._leave([ticket]))
                    raise AdmissionTimeout(int(reserved), int(place) + 1)
                # A release here wakes us at once; one elsewhere is seen on the next poll.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.poll_interval, left)):
                        await self._changed.wait()
                capacity = self._capacity or capacity
                charge = capacity.charge(tokens)
        except FAILURES as exc:
            self._failed(exc)
            self._spawn(self._leave([ticket]))
            return await self._degraded(tokens, max(0.0, deadline - self.clock()))
        except asyncio.CancelledError:
            # The client left (or the server stops): out of the line, or give it back.
            self._held.pop(ticket, None)
            self._spawn(self._leave([ticket]))
            raise

    async def _degraded(self, tokens: int, timeout: float) -> Reservation:
        if self.failure == "closed":
            raise LedgerUnavailable(self.target)
        return await self.fallback.reserve(tokens, timeout)

    def _on_release(self, ticket: str) -> Callable[[Reservation], None]:
        def release(_: Reservation) -> None:
            if self._held.pop(ticket, None) is not None:
                self._spawn(self._leave([ticket]))

        return release

    def _on_grow(self, ticket: str) -> Callable[[Reservation, int], None]:
        def grow(_: Reservation, tokens: int) -> None:
            if ticket in self._held:
                self._held[ticket] += tokens
                self._spawn(self._add(ticket, tokens))

        return grow

    async def _add(self, ticket: str, tokens: int) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._grow(keys=self.keys[3:4], args=[ticket, tokens])
        except FAILURES as exc:
            # Other replicas see less than the engine holds until this answer ends.
            log.debug("growing a KV reservation failed: %s", exc)

    async def _leave(self, tickets: list[str]) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._release(keys=self.keys[:4], args=tickets)
        except FAILURES as exc:
            # The lease runs out on its own within lease_ttl; nothing leaks for good.
            log.debug("releasing %d KV reservation(s) failed: %s", len(tickets), exc)
        finally:
            self._changed.set()  # this process's waiters ask again at once

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.ensure_future(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_ttl / 3)
            tickets = list(self._held)
            if not tickets:
                return
            try:
                async with asyncio.timeout(self.timeout):
                    lost = await self._refresh(
                        keys=self.keys[2:4], args=[_ms(self.lease_ttl), *tickets]
                    )
            except FAILURES as exc:
                log.debug("refreshing KV leases failed: %s", exc)
                continue
            if lost:
                log.warning(
                    "%d KV reservation(s) of this process had expired in %s (was it "
                    "unreachable?); they no longer count",
                    lost,
                    self.target,
                )

    def _failed(self, exc: BaseException) -> None:
        now = self.clock()
        self._retry_at = now + self.retry_interval
        if self.down_since is None:
            self.down_since = now
            action = (
                f"admitting from this process's share (1/{self.share}) of the capacity"
                if self.failure == "open"
                else "answering 503"
            )
            log.warning(
                "KV admission ledger %s unavailable (%s); %s (TRIMPROXY_SESSION_STORE_FAILURE="
                "%s, TRIMPROXY_KV_ADMISSION_REPLICAS); retrying every %g s",
                self.target,
                type(exc).__name__,
                action,
                self.failure,
                self.retry_interval,
            )

    def _recovered(self) -> None:
        if self.down_since is not None:
            log.warning(
                "KV admission ledger %s is back after %.1f s",
                self.target,
                self.clock() - self.down_since,
            )
            self.down_since = None

    async def ping(self) -> bool:
        if not await answers(self.client, self.timeout):
            return False
        # Answered: the next request asks Redis again now, not after the retry
        # interval, so that a /readyz that says ready is what that request meets.
        self._retry_at = 0.0
        return True

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._held:
            await self._leave(list(self._held))
            self._held.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fallback.aclose()
        await self.client.aclose()


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
