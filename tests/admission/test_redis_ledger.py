"""The shared ledger against a real redis-server: one FIFO line for every replica,
leases that expire with a dead replica, refreshed leases, and the fallback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import pytest

from proxy.admission import AdmissionTimeout, Capacity, LedgerUnavailable, MemoryLedger
from proxy.admission.redis_ledger import ACQUIRE_LUA, RedisLedger
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

UPSTREAM = "http://127.0.0.1:8000"
Factory = Callable[..., RedisLedger]


@pytest.fixture
async def ledgers(redis_server: RedisServer) -> AsyncIterator[Factory]:
    made: list[RedisLedger] = []

    def make(
        capacity: int = 1000,
        *,
        share: int = 1,
        failure: Literal["open", "closed"] = "open",
        **kw: Any,
    ) -> RedisLedger:
        ledger = RedisLedger(
            redis_server.url, UPSTREAM, MemoryLedger(None), share=share, failure=failure, **kw
        )
        ledger.set_capacity(Capacity(capacity))
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        await ledger.aclose()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def in_line(redis_server: RedisServer, ledger: RedisLedger) -> int:
    """Tickets waiting in the shared line (the ledger's queue in Redis)."""
    client = redis_server.client()
    try:
        return int(client.zcard(ledger.keys[0]))
    finally:
        client.close()


def reserved_in_redis(redis_server: RedisServer, ledger: RedisLedger) -> int:
    client = redis_server.client()
    try:
        return sum(int(v) for v in client.hvals(ledger.keys[3]))
    finally:
        client.close()


async def test_two_replicas_share_one_capacity(ledgers: Factory, redis_server: RedisServer) -> None:
    a, b = ledgers(), ledgers()
    held = await a.reserve(700, 1)
    with pytest.raises(AdmissionTimeout) as caught:
        await b.reserve(400, 0.2)
    assert caught.value.reserved == 700
    assert reserved_in_redis(redis_server, a) == 700
    ok = await b.reserve(300, 1)
    held.release()
    ok.release()
    await eventually(lambda: reserved_in_redis(redis_server, a) == 0)


async def test_fifo_across_replicas(ledgers: Factory, redis_server: RedisServer) -> None:
    """A large request in line on one replica is not passed by small ones on another."""
    a, b = ledgers(), ledgers()
    held = await a.reserve(600, 1)
    big = asyncio.ensure_future(a.reserve(950, 10))
    await eventually(lambda: in_line(redis_server, a) == 1)  # in line
    small = asyncio.ensure_future(b.reserve(100, 10))  # would fit beside `held`
    await eventually(lambda: in_line(redis_server, a) == 2)  # in line behind it
    assert not big.done() and not small.done()
    held.release()
    first = await asyncio.wait_for(big, 5)
    await asyncio.sleep(0.2)
    assert not small.done()  # 950 + 100 would be over the 1000
    first.release()
    (await asyncio.wait_for(small, 5)).release()


async def test_a_dead_replicas_lease_expires(ledgers: Factory, redis_server: RedisServer) -> None:
    dead = ledgers(lease_ttl=0.5)
    kept = await dead.reserve(1000, 1)  # never released: the replica "dies" holding it
    assert dead._refresher is not None
    dead._refresher.cancel()  # a dead process refreshes nothing
    dead._held.clear()  # and releases nothing at close
    alive = ledgers(lease_ttl=0.5)
    reservation = await alive.reserve(1000, 5)
    # All of the capacity, and the dead replica released nothing: Redis dropped its
    # lease (1000 + 1000 would be in the ledger otherwise).
    assert reserved_in_redis(redis_server, alive) == 1000
    reservation.release()
    assert not kept.released


async def test_a_dead_waiter_at_the_head_blocks_nobody_for_long(
    ledgers: Factory, redis_server: RedisServer
) -> None:
    a = ledgers()
    held = await a.reserve(1000, 1)
    # A replica puts a ticket in line and dies: it never polls (nor leaves) again.
    client = redis_server.client()
    try:
        args: list[str | int] = ["ghost", 1000, 1000, 15_000, 300]
        assert client.eval(ACQUIRE_LUA, 5, *a.keys, *args) == [0, 1000, 0]
    finally:
        client.close()
    waiter = asyncio.ensure_future(a.reserve(500, 10))  # behind the ghost
    await eventually(lambda: in_line(redis_server, a) == 2)
    held.release()
    (await asyncio.wait_for(waiter, 5)).release()


async def test_long_reservations_keep_their_lease(
    ledgers: Factory, redis_server: RedisServer
) -> None:
    a = ledgers(lease_ttl=0.3)
    held = await a.reserve(800, 1)
    await asyncio.sleep(1.0)  # over three lease periods: refreshed meanwhile
    assert reserved_in_redis(redis_server, a) == 800
    with pytest.raises(AdmissionTimeout):
        await ledgers().reserve(800, 0.1)
    held.release()


async def test_redis_down_falls_back_to_this_processs_share(
    ledgers: Factory, redis_server: RedisServer
) -> None:
    a = ledgers(1000, share=4)
    (await a.reserve(100, 1)).release()
    redis_server.stop()
    fallback = await a.reserve(250, 1)  # the fallback ledger: 1000 / 4
    assert a.down_since is not None and a.fallback.reserved == 250
    with pytest.raises(AdmissionTimeout):
        await a.reserve(10, 0.05)
    fallback.release()
    assert a.local_reserved() == 0
    redis_server.start()
    a._retry_at = 0.0  # do not wait out the retry interval
    back = await a.reserve(900, 1)
    assert a.down_since is None and reserved_in_redis(redis_server, a) == 900
    back.release()


async def test_redis_down_closed_refuses(ledgers: Factory, redis_server: RedisServer) -> None:
    a = ledgers(failure="closed")
    redis_server.stop()
    with pytest.raises(LedgerUnavailable):
        await a.reserve(10, 1)
    redis_server.start()


async def test_a_grown_reservation_is_seen_by_every_replica_and_released_whole(
    ledgers: Factory, redis_server: RedisServer
) -> None:
    a, b = ledgers(1000), ledgers(1000)
    held = await a.reserve(600, 1.0)
    assert held.grow(300) == 300 and held.charge == 900
    await eventually(lambda: reserved_in_redis(redis_server, a) == 900)
    with pytest.raises(AdmissionTimeout):
        await b.reserve(200, 0.2)  # 600 would have left room for it; 900 does not
    held.release()
    await eventually(lambda: reserved_in_redis(redis_server, a) == 0)
    assert held.grow(50) == 0  # released: nothing comes back
    await asyncio.sleep(0.05)
    assert reserved_in_redis(redis_server, a) == 0
    (await b.reserve(1000, 1.0)).release()
