"""The one gate of the stored responses (docs/architecture.md §22): look a response or
a chain up, keep one, delete one; the bounds, the metrics and the errors the client
sees.

Every key is namespaced by a hash of the client's API key, so a client never reads
another key's responses, whatever ids it names, and the response id is hashed into
it (a bounded key, whatever the client sent). The ids themselves are minted here
(``mint``): a client never chooses the id a response is stored under.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.chains.entry import Stored, Turn
from proxy.chains.memory import MemoryStore
from proxy.chains.store import ChainBroken, ChainTooLong, ResponseStore, StoreUnavailable
from proxy.errors import PreviousResponseNotFound, ResponseNotFound, ResponseStoreUnavailable
from proxy.metrics import Metrics
from proxy.sessions.identity import client_key
from proxy.settings import Settings

log = logging.getLogger("trimproxy.responses")

#: The most of a client's id an error message echoes.
SHOWN_ID = 64


def mint() -> str:
    """A response id: ``resp_`` and 192 random bits, as OpenAI's are shaped."""
    return "resp_" + secrets.token_hex(24)


def shown(response_id: str) -> str:
    """A client's id as an error message echoes it: bounded."""
    if len(response_id) <= SHOWN_ID:
        return response_id
    return response_id[:SHOWN_ID] + "..."


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=12, person=b"trimproxy-resp")
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: no ambiguous joins
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Found:
    """A chain a request continues: its conversation so far and where it ends."""

    last: Turn
    """The turn of the response continued (the chain's last)."""
    items: list[object]
    """The chain's conversation: each turn's input items, then its output items."""
    key: str
    """The store key of the response continued: the new entry's parent."""
    size: int
    """The chain's bytes so far, for the chain bound."""


class Keeper:
    def __init__(
        self,
        store: ResponseStore,
        metrics: Metrics,
        *,
        entry_bytes: int = 16 * 1024 * 1024,
        chain_bytes: int = 32 * 1024 * 1024,
        enabled: bool = True,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.entry_bytes = entry_bytes
        self.chain_bytes = chain_bytes
        self.enabled = enabled

    def key(self, headers: Mapping[str, str], response_id: str) -> str:
        return _digest(client_key(headers), response_id)

    async def start(self) -> None:
        """Say at start-up where the responses live; an unreachable store is not fatal."""
        if not self.enabled:
            log.info("stored responses (previous_response_id) off: TRIMPROXY_RESPONSE_STORE")
            return
        reachable = await self.store.ping()
        log.log(
            logging.INFO if reachable else logging.WARNING,
            "stored responses (previous_response_id) kept in %s%s",
            self.store.name,
            "" if reachable else ", not reachable yet",
        )

    async def find(self, key: str, response_id: str) -> Stored:
        """The stored response (``GET /v1/responses/{id}``), else the 404."""
        stored = None
        if self.enabled:
            try:
                stored = await self.store.get(key)
            except StoreUnavailable:
                self.metrics.response_store_lookups.labels("unavailable").inc()
                raise self._unavailable() from None
            self.metrics.response_store_lookups.labels("miss" if stored is None else "hit").inc()
        if stored is None:
            raise _not_found(response_id)
        return stored

    async def chain(self, key: str, response_id: str) -> Found:
        """The chain a ``previous_response_id`` continues, else OpenAI's 400
        ``previous_response_not_found``, saying which bound let it go."""
        param = "previous_response_id"
        if not self.enabled:
            raise PreviousResponseNotFound(
                f"Previous response with id '{shown(response_id)}' not found: this proxy "
                "keeps no responses (TRIMPROXY_RESPONSE_STORE is false). Send the whole "
                "conversation as 'input' instead.",
                param=param,
            )
        try:
            walked = await self.store.chain(key, self.chain_bytes)
        except StoreUnavailable:
            self.metrics.response_store_lookups.labels("unavailable").inc()
            raise self._unavailable() from None
        except ChainBroken:
            self.metrics.response_store_lookups.labels("miss").inc()
            raise PreviousResponseNotFound(
                f"An earlier response of the chain of '{shown(response_id)}' is no longer "
                "held: this proxy evicts the least recently used responses past "
                "TRIMPROXY_RESPONSE_STORE_BYTES and TRIMPROXY_RESPONSE_STORE_ENTRIES, and "
                "keeps each for TRIMPROXY_RESPONSE_STORE_TTL seconds after its last use. "
                "Send the whole conversation as 'input' instead.",
                param=param,
            ) from None
        except ChainTooLong:
            self.metrics.response_store_lookups.labels("miss").inc()
            raise PreviousResponseNotFound(
                f"The chain of '{shown(response_id)}' holds more than "
                f"TRIMPROXY_RESPONSE_STORE_CHAIN_BYTES ({self.chain_bytes}) bytes. Send "
                "the whole conversation as 'input' instead.",
                param=param,
            ) from None
        self.metrics.response_store_lookups.labels("miss" if walked is None else "hit").inc()
        if walked is None:
            raise PreviousResponseNotFound(
                f"Previous response with id '{shown(response_id)}' not found. This proxy "
                "keeps responses made with 'store' true for TRIMPROXY_RESPONSE_STORE_TTL "
                "seconds after their last use, each up to TRIMPROXY_RESPONSE_STORE_ENTRY_BYTES "
                "and a chain up to TRIMPROXY_RESPONSE_STORE_CHAIN_BYTES; send the whole "
                "conversation as 'input' instead.",
                param=param,
            )
        items = [item for turn in walked.entries for item in turn.items]
        return Found(walked.entries[-1], items, key, walked.size)

    async def keep(self, key: str, stored: Stored, chain_size: int = 0) -> bool:
        """Keep a response when the bounds allow; one that cannot be kept is counted
        and logged, never the client's error: the answer went out whole already."""
        raw = stored.encode()
        reason = None
        if len(raw) > self.entry_bytes:
            reason = "entry_bytes"
        elif chain_size + len(raw) > self.chain_bytes:
            reason = "chain_bytes"
        else:
            try:
                kept = await self.store.put(key, raw)
            except StoreUnavailable:
                reason = "unavailable"
            else:
                self._gauge()
                return kept
        self.metrics.response_store_skipped.labels(reason).inc()
        log.warning("a response was not stored (%s)", reason)
        return False

    async def forget(self, key: str, response_id: str) -> None:
        deleted = False
        if self.enabled:
            try:
                deleted = await self.store.delete(key)
            except StoreUnavailable:
                self.metrics.response_store_lookups.labels("unavailable").inc()
                raise self._unavailable() from None
            self.metrics.response_store_lookups.labels("hit" if deleted else "miss").inc()
            self._gauge()
        if not deleted:
            raise _not_found(response_id)

    def _gauge(self) -> None:
        held = self.store.held()
        if held is not None:
            self.metrics.response_store_entries.set(held[0])
            self.metrics.response_store_bytes.set(held[1])

    def _unavailable(self) -> ResponseStoreUnavailable:
        return ResponseStoreUnavailable(
            f"The response store ({self.store.name}, TRIMPROXY_REDIS_URL) is unavailable, "
            "so a stored response cannot be read. Retry in a few seconds.",
            headers={"retry-after": "1"},
        )

    async def aclose(self) -> None:
        await self.store.aclose()


def _not_found(response_id: str) -> ResponseNotFound:
    return ResponseNotFound(
        f"Response with id '{shown(response_id)}' not found.", param="response_id"
    )


def build_keeper(settings: Settings, metrics: Metrics) -> Keeper:
    """In Redis when TRIMPROXY_REDIS_URL is set (the replicas' one view), else in memory."""
    store: ResponseStore
    if settings.redis_url and settings.response_store:
        from proxy.chains.redis_store import RedisStore  # redis is imported only when used

        store = RedisStore(
            settings.redis_url,
            settings.response_store_ttl,
            settings.response_store_entries,
            max_bytes=settings.response_store_bytes,
        )
    else:
        if settings.workers > 1 and settings.response_store:
            log.warning(
                "each of the %d workers holds its own stored responses, and a "
                "previous_response_id another one stored is not found: set "
                "TRIMPROXY_REDIS_URL for one view",
                settings.workers,
            )
        store = MemoryStore(
            settings.response_store_entries,
            settings.response_store_ttl,
            max_bytes=settings.response_store_bytes,
        )
    return Keeper(
        store,
        metrics,
        entry_bytes=settings.response_store_entry_bytes,
        chain_bytes=settings.response_store_chain_bytes,
        enabled=settings.response_store,
    )
