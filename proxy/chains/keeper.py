"""The one gate of the stored responses (docs/architecture.md §22): look a response up,
keep one, delete one; the metrics and the errors the client sees.

Every key is namespaced by a hash of the client's API key, so a client never reads
another key's responses, whatever ids it names, and the response id is hashed into
it (a bounded key, whatever the client sent).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from proxy.chains.entry import Stored
from proxy.chains.memory import MemoryStore
from proxy.chains.store import ResponseStore, StoreUnavailable
from proxy.errors import PreviousResponseNotFound, ResponseNotFound, ResponseStoreUnavailable
from proxy.metrics import Metrics
from proxy.sessions.identity import client_key
from proxy.settings import Settings

log = logging.getLogger("trimproxy.responses")


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=12, person=b"trimproxy-resp")
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: no ambiguous joins
        h.update(data)
    return h.hexdigest()


class Keeper:
    def __init__(self, store: ResponseStore, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics

    def key(self, headers: Mapping[str, str], response_id: str) -> str:
        return _digest(client_key(headers), response_id)

    async def start(self) -> None:
        """Say at start-up where the responses live; an unreachable store is not fatal."""
        reachable = await self.store.ping()
        log.log(
            logging.INFO if reachable else logging.WARNING,
            "stored responses (previous_response_id) kept in %s%s",
            self.store.name,
            "" if reachable else ", not reachable yet",
        )

    async def find(self, key: str, response_id: str, param: str) -> Stored:
        """The stored response, else the client's error: ``previous_response_id``
        gets OpenAI's 400 ``previous_response_not_found``, a path id the 404."""
        try:
            stored = await self.store.get(key)
        except StoreUnavailable:
            self.metrics.response_store_lookups.labels("unavailable").inc()
            raise self._unavailable() from None
        self.metrics.response_store_lookups.labels("miss" if stored is None else "hit").inc()
        if stored is not None:
            return stored
        if param == "previous_response_id":
            raise PreviousResponseNotFound(
                f"Previous response with id '{response_id}' not found. This proxy keeps "
                "responses made with 'store' true for TRIMPROXY_RESPONSE_STORE_TTL seconds "
                "after their last use; send the whole conversation as 'input' instead.",
                param=param,
            )
        raise ResponseNotFound(f"Response with id '{response_id}' not found.", param=param)

    async def keep(self, key: str, stored: Stored) -> None:
        """Keep a response; a store that cannot is logged, never the client's error:
        the answer went out whole already."""
        try:
            await self.store.put(key, stored)
        except StoreUnavailable:
            log.warning("a response was not stored: the response store is unavailable")
            return
        self._gauge()

    async def forget(self, key: str, response_id: str) -> None:
        try:
            deleted = await self.store.delete(key)
        except StoreUnavailable:
            self.metrics.response_store_lookups.labels("unavailable").inc()
            raise self._unavailable() from None
        self.metrics.response_store_lookups.labels("hit" if deleted else "miss").inc()
        self._gauge()
        if not deleted:
            raise ResponseNotFound(
                f"Response with id '{response_id}' not found.", param="response_id"
            )

    def _gauge(self) -> None:
        held = self.store.held()
        if held is not None:
            self.metrics.response_store_entries.set(held)

    def _unavailable(self) -> ResponseStoreUnavailable:
        return ResponseStoreUnavailable(
            f"The response store ({self.store.name}, TRIMPROXY_REDIS_URL) is unavailable, "
            "so a stored response cannot be read. Retry in a few seconds.",
            headers={"retry-after": "1"},
        )

    async def aclose(self) -> None:
        await self.store.aclose()


def build_keeper(settings: Settings, metrics: Metrics) -> Keeper:
    """In Redis when TRIMPROXY_REDIS_URL is set (the replicas' one view), else in memory."""
    store: ResponseStore
    if settings.redis_url:
        from proxy.chains.redis_store import RedisStore  # redis is imported only when used

        store = RedisStore(
            settings.redis_url, settings.response_store_ttl, settings.response_store_entries
        )
    else:
        if settings.workers > 1:
            log.warning(
                "each of the %d workers holds its own stored responses, and a "
                "previous_response_id another one stored is not found: set "
                "TRIMPROXY_REDIS_URL for one view",
                settings.workers,
            )
        store = MemoryStore(settings.response_store_entries, settings.response_store_ttl)
    return Keeper(store, metrics)
