"""The failover rule, once for every caller: the first engine of the order, and the
next one when nothing of an answer came from the first.

A request goes to a second engine only when the first gave nothing of an answer
(``retryable`` says which failures those are): a refused connection, one not opened
in time, and, for forwarded requests (``proxy.upstream.unanswered``), a connection
the engine closed before the answer's head, after the transport's one retry on a
fresh connection (an engine that exited while answering: nothing was relayed, so
nothing is lost or repeated). A request that timed out or got an answer is not sent
again. Two engines at most: an order of several engines that all fail is a fleet that
is down, and the prober takes them out of the rotation meanwhile
(docs/architecture.md §20).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from proxy.engines.engine import Engine
from proxy.upstream.calls import dropped

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
        why = "closed the connection before answering" if dropped(exc) else "could not be reached"
        log.info("engine %s %s; retrying on %s", first.label, why, order[1].label)
    return await attempt(order[1]), order[1]
