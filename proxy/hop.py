"""What every layer that talks to the upstream shares, below the transport: the
hop-by-hop headers that never travel through the proxy, and ``CancelOnDisconnect``,
which stops waiting on the upstream when the client leaves (docs/architecture.md §12,
§13)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

# RFC 9110 section 7.6.1 hop-by-hop headers, plus the ones the proxy sets itself.
HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)


class CancelOnDisconnect:
    """Cancels the running task when the client disconnects, and swallows that
    cancellation at the end of the block (``fired`` then says it happened).

    A done-callback on the watcher does it, so waiting for the upstream needs no
    second task and no ``asyncio.wait`` per request. The callback is disarmed on
    exit, so a disconnect noticed later never cancels code outside the block.
    """

    def __init__(self, client_gone: asyncio.Future[None] | None) -> None:
        self._client_gone = client_gone
        self._task: asyncio.Task[Any] | None = None
        self._armed = False
        self.fired = False

    def __enter__(self) -> CancelOnDisconnect:
        if self._client_gone is not None:
            self._task = asyncio.current_task()
            self._armed = True
            self._client_gone.add_done_callback(self._fire)
        return self

    def _fire(self, gone: asyncio.Future[None]) -> None:
        if self._armed and not gone.cancelled() and self._task is not None:
            self.fired = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._armed = False
        if self._client_gone is not None:
            self._client_gone.remove_done_callback(self._fire)
        if self.fired and exc_type is asyncio.CancelledError and self._task is not None:
            self._task.uncancel()
            return True
        return False
