"""Relaying an upstream answer to the client, and watching for the client to leave.

``watch_disconnect`` starts watching when the request is forwarded (right before
``proxy.pipeline.forward`` sends it), after the body has been read and prepared. A request that
streams is watched at once (``STREAM_WATCH_DELAY``); any other one first
``WATCH_DELAY`` (a quarter of a second) later, so a client that left while its prompt
was counted is noticed then.
From there on a disconnect cancels the wait for the answer's head,
and ``Relay`` goes on watching while it pumps the body, closing the upstream
connection at once when the client goes, which is what makes vLLM abort the
request and free its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError
from proxy.hop import HOP_BY_HOP, CancelOnDisconnect
from proxy.pipeline.breakoff import BreakOff, FailureMap, sse_error_event
from proxy.pipeline.continuation import BROKEN, Continuation
from proxy.pipeline.read_deadline import ReadDeadline
from proxy.types import JSON_MEDIA_TYPE

log = logging.getLogger("trimproxy.upstream")

_RESPONSE_DROP = frozenset(
    name.encode("latin-1") for name in HOP_BY_HOP | {"content-length", "date", "server"}
)

#: Called with each chunk of a relayed stream before it is sent on (KV admission's
#: ``AnswerWatch`` counts the tokens of an answer that may outgrow its reservation).
ChunkHook = Callable[[bytes], None]


class Answer(Protocol):
    """What the relay needs of a forwarded request (``proxy.pipeline.forward.Sent``): the one
    hook between the forward step and the relay."""

    @property
    def response(self) -> aiohttp.ClientResponse: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers the proxy adds."""
        ...

    @property
    def failure(self) -> FailureMap: ...

    @property
    def on_first_byte(self) -> Callable[[], None] | None: ...

    @property
    def on_chunk(self) -> ChunkHook | None: ...

    @property
    def continuation(self) -> Continuation | None:
        """How a stream that breaks off goes on elsewhere (None: it ends in an error)."""
        ...

    def end(self, complete: bool, captured: bytes | None) -> None:
        """Once, when the relay is over: whether the body went out whole, and the body
        kept (``capture_limit``)."""
        ...


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], extra: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """The upstream's header lines as they came (``ClientResponse.raw_headers``: the
    bytes, not a decoded multidict), less hop-by-hop ones, plus ``extra``."""
    out = [(name, value) for key, value in raw if (name := key.lower()) not in _RESPONSE_DROP]
    # A loop, not extend() over a generator: no generator frame on every request.
    for k, v in extra.items():
        out.append((k.lower().encode("latin-1"), v.encode("latin-1")))
    return out


class Relay(Response):
    """Relay an upstream response to the client, chunk by chunk, as it arrives.

    Nothing is buffered, so SSE tokens reach the client as the upstream sends them.
    The client's ``http.disconnect`` is watched all along; when it comes, the
    upstream connection is closed at once (not returned to the pool), which is what
    makes vLLM abort the request and free its KV blocks.
    """

    def __init__(
        self,
        answer: Answer,
        client_gone: asyncio.Future[None],
        *,
        capture_limit: int = 0,
        error_event: Callable[[ProxyError], bytes] = sse_error_event,
    ) -> None:
        upstream = self._upstream = answer.response
        self._answer = answer
        self._client_gone = client_gone
        self._on_first_byte = answer.on_first_byte
        # Up to this many bytes of the body are kept for on_end (usage comparison);
        # a longer body is relayed all the same, just not kept.
        self._capture_limit = capture_limit
        self._captured: list[bytes] | None = [] if capture_limit > 0 else None
        # A stream's last event when it broke off: in its dialect's envelope.
        self._error_event = error_event
        self.status_code = upstream.status
        self.raw_headers = response_headers(upstream.raw_headers, answer.headers)
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            with CancelOnDisconnect(self._client_gone):
                if self._whole():
                    await self._send_whole(send)
                elif self._upstream.content.is_eof():
                    # All of it in already (a burst): no wait for a task to spare, and
                    # making one would only cost (docs/performance.md §6).
                    await self._pump(send)
                else:
                    # In a task of its own: each chunk's wait for the upstream then
                    # resumes the pump's few frames, not the dozen of the app and its
                    # middleware awaiting it: cheaper on every paced event
                    # (docs/performance.md §6).
                    # Awaiting the task hands it a cancellation of this one.
                    await asyncio.get_running_loop().create_task(self._pump(send))
                completed = True
        finally:
            self._client_gone.cancel()
            if completed:
                self._upstream.release()
            else:
                self._upstream.close()
            captured = b"".join(self._captured) if completed and self._captured else None
            self._answer.end(completed, captured)

    def _whole(self) -> bool:
        """Whether the answer is sent in one piece (``_send_whole``)."""
        length = self._upstream.content_length
        return self._captured is not None and length is not None and length <= self._capture_limit

    async def _pump(self, send: Send) -> None:
        """The head, then the body chunk by chunk as aiohttp hands them over, all
        through ``send`` (or the ``body_send`` it names): every middleware sees every
        byte. Sending the body past the middleware instead was cheaper on a paced
        stream (docs/performance.md §6), but a gzip, tracing or metering middleware
        then missed it."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        # A send that only passes the body on after the head names where
        # (``middleware.Accounting``): a call less per chunk (docs/performance.md §6).
        send = getattr(send, "body_send", send)
        # Locals, not attributes, in the loop: it runs once per SSE event.
        on_first_byte = self._on_first_byte
        on_chunk = self._answer.on_chunk
        captured = self._captured
        limit = self._capture_limit
        kept = 0
        read = self._upstream.content.readany  # b"" at the end
        deadline = ReadDeadline.take_over(self._upstream)
        now = asyncio.get_running_loop().time
        try:
            while chunk := await read():
                if on_first_byte is not None:
                    on_first_byte()
                    on_first_byte = None
                if on_chunk is not None:
                    on_chunk(chunk)
                if captured is not None:
                    kept += len(chunk)
                    if kept <= limit:
                        captured.append(chunk)
                    else:
                        captured = self._captured = None
                message = {"type": "http.response.body", "body": chunk, "more_body": True}
                if deadline is None:
                    await send(message)
                else:
                    deadline.last = None  # a client that reads slowly is no idle upstream
                    await send(message)
                    deadline.last = now()
        except BROKEN as exc:
            if deadline is not None:
                deadline.cancel()
                deadline = None
            await self._broken(send, exc)
        finally:
            if deadline is not None:
                deadline.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _broken(self, send: Send, exc: BaseException) -> None:
        """The upstream broke off after the head went out (``proxy.pipeline.breakoff``)."""
        answer = self._answer
        rest = BreakOff(self._upstream, answer.continuation, answer.failure, self._error_event)
        try:
            await rest.finish(send, exc)
        finally:
            self._upstream = rest.upstream

    async def _send_whole(self, send: Send) -> None:
        """A small answer of known length (a non-streaming completion): one read, one
        send, and the body kept for the usage comparison. Should the upstream break
        off mid-body, nothing has gone out yet and the client gets a clean 502."""
        if self._on_first_byte is not None:
            self._on_first_byte()
        try:
            body = await self._upstream.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            error = self._answer.failure(exc, self._upstream)
            body = error.body()
            self.status_code = error.status
            self.raw_headers = [(b"content-type", JSON_MEDIA_TYPE.encode())]
            self._captured = None
        else:
            self._captured = [body]
        self.raw_headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": body})


#: Seconds before a request's client is watched. An answer that is over sooner (most
#: non-streamed ones behind a fast engine) never pays for the watcher task, its
#: ``receive`` and its cancellation (docs/performance.md §6); one that takes longer
#: notices a client that left within this delay, well inside the 1.5 s that frees the
#: engine's KV blocks in time (``test_client_disconnect_closes_the_upstream_at_once``).
WATCH_DELAY = 0.25
#: Streams are watched from the start: they last, so the watcher's cost is nothing
#: beside them, and a client that stops a stream is the common case. A delay would
#: also widen the window in which a proxy that shares its cores with a CPU engine,
#: and is not scheduled for seconds, misses the moment (docs/architecture.md §13).
STREAM_WATCH_DELAY = 0.0


def watch_disconnect(receive: Receive, delay: float = WATCH_DELAY) -> asyncio.Future[None]:
    """A future that completes when the client disconnects; call once the body is read.

    The caller owns it: it is handed to the send (``Transport.send``) and then to ``Relay``,
    which cancels it at the end; on an error in between the caller cancels it. The
    task that waits on ``receive`` starts ``delay`` seconds later, unless the future is
    done by then; cancelling the future stops the timer and the task.
    """
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    watcher: list[asyncio.Task[None]] = []

    def start() -> None:
        if not gone.done():
            watcher.append(loop.create_task(_wait_disconnect(receive, gone)))

    timer = loop.call_later(delay, start) if delay > 0 else None
    if timer is None:
        start()

    def stop(_: asyncio.Future[None]) -> None:
        if timer is not None:
            timer.cancel()
        for task in watcher:
            task.cancel()

    gone.add_done_callback(stop)
    return gone


async def _wait_disconnect(receive: Receive, gone: asyncio.Future[None]) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a client we cannot hear from is gone all the same
        log.debug("receive failed while watching for a disconnect", exc_info=True)
    if not gone.done():
        gone.set_result(None)
