"""An upstream answer that broke off after its head went out to the client.

The relay's rare path (``proxy.pipeline.relay.Relay``): the answer goes on on another engine
(``proxy.pipeline.continuation``, docs/architecture.md §23), the engine's own error event is
relayed as it came, or the answer ends as it can: a stream with a final error event in
its dialect's envelope, and every answer broken off (``RelayAborted``), so that no
client takes a cut answer for a complete one. Kept apart from the relay's loop, which
runs on every chunk, so that this code costs nothing until a stream breaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from starlette.types import Send

from proxy.errors import ProxyError
from proxy.pipeline.continuation import BROKEN, Continuation, EngineErrorEvent
from proxy.pipeline.read_deadline import ReadDeadline

log = logging.getLogger("trimproxy.upstream")

#: The error for an upstream answer that broke off mid-body (``exc``: what the HTTP
#: client raised, on the answer given), counted: ``Transport.failure``.
FailureMap = Callable[[BaseException, aiohttp.ClientResponse], ProxyError]


class RelayAborted(Exception):
    """Raised out of the app when the upstream failed after the answer's head went out.

    The only way an ASGI app can make the server break the connection off: the
    client then sees an incomplete body (no last chunk, fewer bytes than declared)
    instead of a clean end that looks like success. Not a ``ProxyError``: no error
    answer can be sent any more. ``quiet_relay_aborts`` keeps uvicorn from logging
    it as a crash; the relay logs one warning line of its own.
    """


class _DropRelayAborts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, RelayAborted)


def quiet_relay_aborts() -> None:
    """Keep ``RelayAborted`` out of uvicorn's error log (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropRelayAborts) for f in logger.filters):
        logger.addFilter(_DropRelayAborts())


def sse_error_event(error: ProxyError) -> bytes:
    """The final event of a stream the upstream broke off: OpenAI's error object, the
    shape vLLM itself streams on a failure and the one the openai SDK raises on."""
    return b"data: " + error.body() + b"\n\n"


class BreakOff:
    """The rest of one answer whose upstream broke off; ``upstream``: the answer being
    relayed now (a continuation replaces it), for the relay to close or release."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        continuation: Continuation | None,
        failure: FailureMap,
        error_event: Callable[[ProxyError], bytes],
    ) -> None:
        self.upstream = upstream
        self._continuation = continuation
        self._failure = failure
        self._error_event = error_event

    async def finish(self, send: Send, exc: BaseException) -> None:
        """Go on elsewhere, or end the answer as it can (``RelayAborted``)."""
        if isinstance(exc, EngineErrorEvent) and exc.head:
            await send({"type": "http.response.body", "body": exc.head, "more_body": True})
        if self._continuation is not None:
            broke = await self._continue(send, self._continuation, exc)
            if broke is None:
                return
            exc = broke
        if isinstance(exc, EngineErrorEvent):
            # The engine's own error event, relayed as it came, and the rest of its stream.
            await send({"type": "http.response.body", "body": exc.rest, "more_body": True})
            try:
                while chunk := await self.upstream.content.readany():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                return
            except BROKEN as again:
                exc = again
        # No error answer can follow the head: a stream gets a final error event, and
        # then every answer is broken off.
        error = self._failure(exc, self.upstream)
        log.warning("upstream answer broke off: %s", type(exc).__name__)
        if self.upstream.content_type == "text/event-stream":
            event = self._error_event(error)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        raise RelayAborted(error.code) from None

    async def _continue(
        self, send: Send, continuation: Continuation, exc: BaseException
    ) -> BaseException | None:
        """The rest of the answer from the next engines, re-framed as the same answer;
        None once it ended, else what broke the last stream when none can go on."""
        while (resumed := await continuation.resume(exc)) is not None:
            self.upstream.close()
            self.upstream, comment = resumed
            await send({"type": "http.response.body", "body": comment, "more_body": True})
            deadline = ReadDeadline.take_over(self.upstream)
            now = asyncio.get_running_loop().time
            reframe, keep = continuation.reframe, continuation.so_far.keep
            assert reframe is not None
            try:
                while chunk := await self.upstream.content.readany():
                    if deadline is not None:
                        deadline.last = None
                    if out := reframe(chunk):
                        keep(out)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    if deadline is not None:
                        deadline.last = now()
                return None
            except BROKEN as again:
                exc = again
                if isinstance(again, EngineErrorEvent) and again.head:
                    keep(again.head)
                    message = {"type": "http.response.body", "body": again.head, "more_body": True}
                    await send(message)
            finally:
                if deadline is not None:
                    deadline.cancel()
        return exc
