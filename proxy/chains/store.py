"""What the keeper needs from a response store, whichever one holds the responses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from proxy.chains.entry import Stored, Turn


class StoreUnavailable(Exception):
    """The store could not answer (Redis down or slow)."""


class ChainBroken(Exception):
    """An ancestor of the response is no longer held (evicted, expired or deleted)."""


class ChainTooLong(Exception):
    """The chain holds more bytes than the chain bound."""


@dataclass(frozen=True, slots=True)
class Chain:
    entries: list[Turn]
    """The chain's turns, its first response's first; the one asked for last."""
    size: int
    """Their encoded bytes together."""


class ResponseStore(Protocol):
    """Responses by key (the client's namespace and the response id), one entry per
    turn (``proxy.chains.entry``); each lives until it is deleted, evicted (least
    recently used first, by entries and by bytes), or idle for the store's TTL."""

    name: str

    async def get(self, key: str) -> Stored | None:
        """The entry, its idle time restarted; None when there is none."""
        ...

    async def chain(self, key: str, max_bytes: int) -> Chain | None:
        """The entry and its ancestors, each one's idle time restarted; None when the
        entry is missing. Raises ``ChainBroken``, ``ChainTooLong``."""
        ...

    async def put(self, key: str, raw: bytes) -> bool:
        """Keep an encoded entry; False (nothing written) when the key is taken: a
        stored entry is never overwritten."""
        ...

    async def delete(self, key: str) -> bool:
        """Whether there was an entry to delete."""
        ...

    def held(self) -> tuple[int, int] | None: ...  # entries, bytes; None if shared

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...
