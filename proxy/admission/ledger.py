"""The token ledger: its Protocol, the reservation handle, and the in-memory ledger.

A reservation is ``charge`` tokens of the engine's KV capacity, held from admission to
the end of the answer. Waiting is strict FIFO: while the oldest waiter does not fit,
nobody behind it is admitted, however small, so a large request is never starved by
a stream of small ones (the price: a small request may wait behind a large one that
could have squeezed past). A request larger than the whole capacity is charged the
whole capacity (``Capacity.charge``), so it waits until the ledger is empty and then
runs alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from proxy.admission.capacity import Capacity


class AdmissionTimeout(Exception):
    """No room within the timeout; the gate turns this into 429 ``overloaded``."""

    def __init__(self, reserved: int, waiting: int) -> None:
        super().__init__(reserved, waiting)
        self.reserved = reserved
        self.waiting = waiting


class LedgerUnavailable(Exception):
    """The shared ledger failed and TRIMPROXY_SESSION_STORE_FAILURE=closed."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class Reservation:
    """One admitted request's tokens. ``release()`` is idempotent and never blocks.

    Also an async context manager (``async with await ledger.reserve(n): ...``).
    ``waited`` is the seconds spent in the queue. ``grow`` adds tokens to a reservation
    whose answer outgrew it: at once, without waiting (the engine holds them already),
    so the ledger may show more than its capacity until it ends, and newcomers wait.
    """

    __slots__ = ("_after", "_on_grow", "_on_release", "_released", "charge", "waited")

    def __init__(
        self,
        charge: int,
        waited: float,
        on_release: Callable[[Reservation], None] | None,
        on_grow: Callable[[Reservation, int], None] | None = None,
    ) -> None:
        self.charge = charge
        self.waited = waited
        self._on_release = on_release
        self._on_grow = on_grow
        self._after: Callable[[Reservation], None] | None = None
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._on_grow = None
        if self._on_release is not None:
            callback, self._on_release = self._on_release, None
            callback(self)
        if self._after is not None:
            after, self._after = self._after, None
            after(self)

    def grow(self, tokens: int) -> int:
        """Hold ``tokens`` more; the tokens added (0 once released, or unmetered)."""
        if tokens <= 0 or self._on_grow is None:
            return 0
        self._on_grow(self, tokens)
        self.charge += tokens
        return tokens

    def then(self, callback: Callable[[Reservation], None]) -> None:
        """Run ``callback`` once, at release (the gate's gauge bookkeeping)."""
        self._after = callback

    def __del__(self) -> None:
        # A safety net, not the way out: a reservation dropped without release (a
        # response object that was never sent) must not hold KV tokens for good.
        if not self._released and self._on_release is not None:
            self.release()

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def unmetered(waited: float = 0.0) -> Reservation:
    """A reservation of nothing: the capacity is unknown (``auto`` before the scrape)."""
    return Reservation(0, waited, None)


class Ledger(Protocol):
    """Reserve tokens of one upstream's KV capacity, FIFO, with a timeout."""

    name: str

    @property
    def capacity(self) -> Capacity | None: ...

    def set_capacity(self, capacity: Capacity | None) -> None: ...

    async def reserve(self, tokens: int, timeout: float) -> Reservation:
        """Wait in line for ``tokens``; raises ``AdmissionTimeout`` after ``timeout`` s."""
        ...

    def local_reserved(self) -> int:
        """Tokens this process holds now (summed over processes, the gauge adds up)."""
        ...

    async def ping(self) -> bool:
        """Whether the store it keeps its line in answers (a memory ledger always does)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(eq=False, slots=True)
class _Waiter:
    tokens: int
    future: asyncio.Future[Reservation]
    since: float
    done: bool = field(default=False)


class MemoryLedger:
    """The per-process ledger. Every step runs on the event loop without an ``await``
    between check and update, so it needs no lock."""

    name = "memory"

    def __init__(
        self, capacity: Capacity | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._capacity = capacity
        self.clock = clock
        self.reserved = 0
        self._queue: deque[_Waiter] = deque()

    @property
    def capacity(self) -> Capacity | None:
        return self._capacity

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def set_capacity(self, capacity: Capacity | None) -> None:
        self._capacity = capacity
        self._drain()

    def local_reserved(self) -> int:
        return self.reserved

    async def reserve(self, tokens: int, timeout: float) -> Reservation:
        capacity = self._capacity
        if capacity is None:
            return unmetered()
        if not self._queue and self.reserved + capacity.charge(tokens) <= capacity.tokens:
            return self._grant(capacity.charge(tokens), 0.0)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(tokens, loop.create_future(), self.clock())
        self._queue.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            if self._leave(waiter):
                raise AdmissionTimeout(self.reserved, len(self._queue)) from None
            return waiter.future.result()  # granted as the timer fired: take it
        except asyncio.CancelledError:
            if not self._leave(waiter):
                waiter.future.result().release()  # granted, but nobody will use it
            raise

    def _leave(self, waiter: _Waiter) -> bool:
        """Take a waiter out of the line; False if it had been granted already."""
        if waiter.done:
            return False
        waiter.done = True
        waiter.future.cancel()
        self._queue.remove(waiter)
        self._drain()  # the ones behind it may fit now
        return True

    def _grant(self, charge: int, waited: float) -> Reservation:
        self.reserved += charge
        return Reservation(charge, waited, self._release, self._grow)

    def _grow(self, reservation: Reservation, tokens: int) -> None:
        self.reserved += tokens

    def _release(self, reservation: Reservation) -> None:
        self.reserved -= reservation.charge
        self._drain()

    def _drain(self) -> None:
        capacity = self._capacity
        now = self.clock()
        while self._queue:
            head = self._queue[0]
            if capacity is None:
                charge = 0
            else:
                charge = capacity.charge(head.tokens)
                if self.reserved + charge > capacity.tokens:
                    return
            self._queue.popleft()
            head.done = True
            if charge:
                head.future.set_result(self._grant(charge, now - head.since))
            else:
                head.future.set_result(unmetered(now - head.since))

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        while self._queue:
            waiter = self._queue.popleft()
            waiter.done = True
            waiter.future.cancel()
