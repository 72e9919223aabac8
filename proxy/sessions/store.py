"""What the gate needs from a session store, whichever one holds the state."""

from __future__ import annotations

from typing import Protocol

from proxy.sessions.identity import ConversationHashes
from proxy.sessions.rule import Decision, Limits


class StoreUnavailable(Exception):
    """The store could not answer; the gate applies TRIMPROXY_SESSION_STORE_FAILURE."""


class SessionStore(Protocol):
    """Runs ``decide`` for one session atomically: read, check and update as one step."""

    name: str

    async def admit(self, key: str, hashes: ConversationHashes, limits: Limits) -> Decision: ...

    def held(self) -> int | None: ...  # sessions held here, for the gauge; None if shared

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...
