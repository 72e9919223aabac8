"""The failover rule, once for every caller: the first engine of the order, and the
next one when the first could not be reached.

A request goes to a second engine only when nothing reached the first (a refused
connection, one not opened in time: ``retryable`` says which failures those are); a
request whose bytes went out may have been acted on, and is not sent twice. Two tries
at most: an order of several engines that all refuse is a fleet that is down, and the
prober takes them out of the rotation meanwhile (docs/architecture.md §20).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from proxy.engines.engine import Engine

log = logging.getLogger("trimproxy.engines")

T = TypeVar("T")


async def failover(
    order: Sequence[Engine],
    attempt: Callable[[Engine], Awaitable[T]],
    retryable: Callable[[BaseException], bool],
) -> tuple[T, Engine]:
    """``attempt`` on ``order[0]``, then once on ``order[1]`` when the first failed in a
    way ``retryable`` allows; the result and the engine that gave it."""
    first = order[0]
    try:
        return await attempt(first), first
    except Exception as exc:
        if len(order) < 2 or not retryable(exc):
            raise
        log.info("engine %s could not be reached; retrying on %s", first.label, order[1].label)
    return await attempt(order[1]), order[1]
