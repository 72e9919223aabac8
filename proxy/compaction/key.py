"""The compaction key, found once at start (docs/architecture.md §24): the operator's
``TRIMPROXY_COMPACTION_KEY``; else the one kept in the Redis of the shared stores
(the first replica to start draws it, every other reads it); else one drawn here, and
the items this process makes do not outlive it."""

from __future__ import annotations

import asyncio
import logging
import os

from proxy.compaction.seal import KEY_BYTES, Sealer, key_from_text
from proxy.redis_client import FAILURES, connect
from proxy.settings import Settings

log = logging.getLogger("trimproxy.compaction")

REDIS_KEY = "trimproxy:compaction:key"
_REDIS_TIMEOUT = 5.0


async def build_sealer(settings: Settings) -> Sealer:
    if settings.compaction_key:
        key = key_from_text(settings.compaction_key)
        where = "TRIMPROXY_COMPACTION_KEY"
    elif settings.redis_url and (shared := await _from_redis(settings.redis_url)) is not None:
        key, where = shared, "the key kept in Redis (TRIMPROXY_REDIS_URL)"
    else:
        key = os.urandom(KEY_BYTES)
        where = (
            "a key drawn at start: compaction items die with this process; set "
            "TRIMPROXY_COMPACTION_KEY (or TRIMPROXY_REDIS_URL) to keep them"
        )
    log.info("compaction items sealed with %s", where)
    return Sealer(key, settings.compaction_max_bytes)


async def _from_redis(url: str) -> bytes | None:
    client, where = connect(url, _REDIS_TIMEOUT, max_connections=1)
    try:
        async with asyncio.timeout(_REDIS_TIMEOUT):
            await client.set(REDIS_KEY, os.urandom(KEY_BYTES).hex(), nx=True)
            value = await client.get(REDIS_KEY)
    except FAILURES:
        log.warning("the compaction key could not be read from %s", where)
        return None
    finally:
        await client.aclose()
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return key_from_text(text)
