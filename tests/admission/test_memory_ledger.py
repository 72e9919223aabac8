"""The in-memory ledger: FIFO order, release on every ending, the huge request, refresh."""

from __future__ import annotations

import asyncio

import pytest

from proxy.admission import AdmissionTimeout, Capacity, MemoryLedger, Reservation


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def start(ledger: MemoryLedger, tokens: int, timeout: float = 60) -> asyncio.Task[Reservation]:
    return asyncio.ensure_future(ledger.reserve(tokens, timeout))


async def test_admits_at_once_while_it_fits() -> None:
    ledger = MemoryLedger(Capacity(1000))
    a = await ledger.reserve(400, 1)
    b = await ledger.reserve(600, 1)
    assert (a.charge, b.charge, a.waited, b.waited) == (400, 600, 0.0, 0.0)
    assert ledger.reserved == 1000
    a.release()
    b.release()
    assert ledger.reserved == 0


async def test_large_request_is_not_starved_by_small_ones() -> None:
    """A big request at the head of the line holds back smaller ones that would fit."""
    ledger = MemoryLedger(Capacity(1000))
    held = await ledger.reserve(600, 1)
    big = start(ledger, 950)
    await settle()
    smalls = [start(ledger, 100) for _ in range(3)]  # each would fit beside `held`
    await settle()
    assert not big.done() and not any(s.done() for s in smalls)
    assert ledger.waiting == 4
    held.release()
    await settle()
    assert big.done() and not any(s.done() for s in smalls)
    (await big).release()
    await settle()
    assert all(s.done() for s in smalls)
    assert ledger.reserved == 300  # the big one ended; all three small ones run


async def test_grants_follow_arrival_order() -> None:
    ledger = MemoryLedger(Capacity(100))
    first = await ledger.reserve(100, 1)
    order: list[int] = []

    async def one(i: int) -> None:
        reservation = await ledger.reserve(60 if i % 2 else 30, 60)
        order.append(i)
        await asyncio.sleep(0)
        reservation.release()

    tasks = [asyncio.ensure_future(one(i)) for i in range(8)]
    await settle()
    first.release()
    await asyncio.gather(*tasks)
    assert order == list(range(8))
    assert ledger.reserved == 0


async def test_release_is_idempotent_and_context_managed() -> None:
    ledger = MemoryLedger(Capacity(100))
    reservation = await ledger.reserve(70, 1)
    reservation.release()
    reservation.release()
    assert ledger.reserved == 0 and reservation.released
    with pytest.raises(RuntimeError):
        async with await ledger.reserve(50, 1):
            assert ledger.reserved == 50
            raise RuntimeError("the upstream failed")
    assert ledger.reserved == 0


async def test_timeout_raises_and_leaves_the_line() -> None:
    ledger = MemoryLedger(Capacity(100))
    held = await ledger.reserve(80, 1)
    with pytest.raises(AdmissionTimeout) as caught:
        await ledger.reserve(50, 0.01)
    assert (caught.value.reserved, caught.value.waiting) == (80, 0)
    assert ledger.waiting == 0
    held.release()
    assert ledger.reserved == 0


async def test_a_waiter_that_times_out_unblocks_those_behind() -> None:
    ledger = MemoryLedger(Capacity(100))
    held = await ledger.reserve(50, 1)
    big = start(ledger, 100, timeout=0.05)  # at the head, cannot fit while `held` is held
    await settle()
    small = start(ledger, 40)
    with pytest.raises(AdmissionTimeout):
        await big
    reservation = await asyncio.wait_for(small, 1)
    assert ledger.reserved == 90
    reservation.release()
    held.release()


async def test_a_cancelled_waiter_leaves_and_holds_nothing() -> None:
    """The client left while waiting: its task is cancelled, nothing stays reserved."""
    ledger = MemoryLedger(Capacity(100))
    held = await ledger.reserve(100, 1)
    gone = start(ledger, 50)
    after = start(ledger, 50)
    await settle()
    gone.cancel()
    await settle()
    assert ledger.waiting == 1
    held.release()
    (await asyncio.wait_for(after, 1)).release()
    assert ledger.reserved == 0 and ledger.waiting == 0


async def test_granted_but_cancelled_gives_it_back() -> None:
    """Granted in the same loop step as the cancel: the grant is released, not leaked."""
    ledger = MemoryLedger(Capacity(100))
    held = await ledger.reserve(100, 1)
    waiter = start(ledger, 50)
    await settle()
    held.release()  # grants the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert ledger.reserved == 0


async def test_a_request_larger_than_the_capacity_runs_alone() -> None:
    ledger = MemoryLedger(Capacity(1000))
    small = await ledger.reserve(10, 1)
    huge = start(ledger, 5000)
    await settle()
    assert not huge.done()
    small.release()
    reservation = await asyncio.wait_for(huge, 1)
    assert reservation.charge == 1000 and ledger.reserved == 1000  # never above capacity
    other = start(ledger, 1)
    await settle()
    assert not other.done()
    reservation.release()
    (await asyncio.wait_for(other, 1)).release()


async def test_capacity_refresh_admits_waiters_and_none_means_unmetered() -> None:
    ledger = MemoryLedger(Capacity(100))
    held = await ledger.reserve(100, 1)
    waiter = start(ledger, 100)
    await settle()
    ledger.set_capacity(Capacity(200))
    reservation = await asyncio.wait_for(waiter, 1)
    assert ledger.reserved == 200
    ledger.set_capacity(Capacity(50))  # shrinks: new requests wait for the excess to end
    late = start(ledger, 10)
    await settle()
    assert not late.done()
    ledger.set_capacity(None)  # capacity unknown: admission is off
    free = await asyncio.wait_for(late, 1)
    assert free.charge == 0
    for r in (held, reservation, free):
        r.release()
    assert ledger.reserved == 0


async def test_block_rounding() -> None:
    ledger = MemoryLedger(Capacity(320, block_size=32))
    a = await ledger.reserve(33, 1)
    assert a.charge == 64
    a.release()


async def test_a_dropped_reservation_is_given_back() -> None:
    """A reservation nobody released (its response was never sent) does not leak."""
    ledger = MemoryLedger(Capacity(100))
    await ledger.reserve(100, 1)  # dropped at once
    assert ledger.reserved == 0
