"""What the keeper needs from a response store, whichever one holds the responses."""

from __future__ import annotations

from typing import Protocol

from proxy.chains.entry import Stored


class StoreUnavailable(Exception):
    """The store could not answer (Redis down or slow)."""


class ResponseStore(Protocol):
    """Responses by key (the client's namespace and the response id); each entry lives
    until it is deleted, evicted, or idle for the store's TTL."""

    name: str

    async def get(self, key: str) -> Stored | None:
        """The entry, its idle time restarted; None when there is none."""
        ...

    async def put(self, key: str, stored: Stored) -> None: ...

    async def delete(self, key: str) -> bool:
        """Whether there was an entry to delete."""
        ...

    def held(self) -> int | None: ...  # entries held here, for the gauge; None if shared

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...
