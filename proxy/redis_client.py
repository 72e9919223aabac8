"""One Redis client, opened as every shared store opens it: the session store, the KV
admission ledger and the response store (docs/architecture.md §18).

Each call of a store has one deadline of its own (``asyncio.timeout``), so the
sockets get no per-read timeout: one timer a call instead of one per socket read
(docs/performance.md §6). A broken pooled connection is retried once at once: the
pooled sockets of a Redis that restarted fail once, then reconnect; a timeout is not
retried.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

#: What a call to a Redis that is down or slow raises.
FAILURES = (RedisError, OSError, TimeoutError)


def connect(url: str, timeout: float, max_connections: int = 64) -> tuple[Redis, str]:
    """The client (it owns and closes its pool), and where it points for logs:
    ``redis host:port/db``, never the password. ``timeout`` bounds the wait for a free
    connection and the connect."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        socket_connect_timeout=timeout,
        socket_timeout=None,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    kw = pool.connection_kwargs
    where = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
    return Redis.from_pool(pool), f"redis {where}/{kw.get('db', 0)}"


async def answers(client: Redis, timeout: float) -> bool:
    """Whether Redis answers a ``PING`` within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await client.ping()
    except FAILURES:
        return False
    return True
