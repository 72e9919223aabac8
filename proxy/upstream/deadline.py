"""The answer's head within what the request's count left of the read timeout.

A prepared request's count (``Prepared.counted_in``) and its wait for the answer's
head share one read timeout (docs/architecture.md §12): a count that took
``SHARED_FROM`` seconds or more leaves the head only what is left. A shorter one is
not worth the timer, so ``Transport.send`` comes here only for the long ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import aiohttp

#: A count that took this many seconds or more shares the read timeout with the
#: answer's head; a shorter one is not worth the timer.
SHARED_FROM = 0.05


async def head_within(
    request: Awaitable[aiohttp.ClientResponse], left: float
) -> aiohttp.ClientResponse | None:
    """The answer's head if it comes within ``left`` seconds, else None (aiohttp's own
    read timeout still raises, as on any request: the usual 504)."""
    try:
        async with asyncio.timeout(left) as bound:
            return await request
    except TimeoutError:
        if not bound.expired():
            raise
    return None
