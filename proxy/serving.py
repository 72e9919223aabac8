"""uvicorn's HTTP protocols with a header timeout: a slow client holds nothing for long.

uvicorn closes a kept-alive connection after ``timeout_keep_alive`` of silence, but
only until its first byte: a client that opens a connection and sends nothing, or
half a request line and then nothing, keeps the socket (and a slot of the
operator's file-descriptor limit) forever. These subclasses add one timer: from the
moment a connection opens, or its previous answer ends, the client has
``TRIMPROXY_HEADER_TIMEOUT`` seconds to complete the next request's headers, or the
connection is closed; a WebSocket upgrade ends it. The same window counts the bytes:
request line and headers over ``TRIMPROXY_MAX_HEADER_BYTES`` get a 431 and a close
(httptools has no limit of its own). The body has its own timeout and size limit, in the app (408,
``TRIMPROXY_BODY_TIMEOUT``; 413, ``TRIMPROXY_MAX_BODY_BYTES``).

Both values are read from the environment, where ``trimproxy serve`` puts the
validated setting before uvicorn starts: uvicorn builds these classes itself (in
every worker process), so they cannot be handed a settings object.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_ENV = "TRIMPROXY_HEADER_TIMEOUT"
MAX_HEADER_BYTES_ENV = "TRIMPROXY_MAX_HEADER_BYTES"
_DEFAULT_HEADER_TIMEOUT = 10.0
_DEFAULT_MAX_HEADER_BYTES = 65536
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_TOO_LARGE_BODY = (
    b'{"error": {"message": "The request line and headers are larger than this proxy '
    b'accepts (TRIMPROXY_MAX_HEADER_BYTES).", "type": "invalid_request_error", '
    b'"param": null, "code": "request_header_fields_too_large"}}'
)


class _HeaderTimeout(asyncio.Protocol):
    """The timer; mixed in before a uvicorn protocol class.

    Arming is setting a deadline, disarming is clearing it: a kept-alive connection
    arms and disarms once a request, and one timer that, when it fires, looks at the
    deadline (and sets itself again for a later one) costs no timer of the event loop
    per request.
    """

    transport: Any
    cycle: Any
    loop: asyncio.AbstractEventLoop
    _header_timer: asyncio.TimerHandle | None = None
    #: When the headers must be complete (``loop.time()``); None while not waiting.
    _header_deadline: float | None = None
    _header_timeout: float = _DEFAULT_HEADER_TIMEOUT
    _max_header_bytes: int = _DEFAULT_MAX_HEADER_BYTES
    #: Bytes received since the timer was armed, while the headers were incomplete.
    _header_bytes: int = 0
    #: The cycle that was current when the timer was armed: a different one means
    #: a new request's headers are complete.
    _armed_cycle: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._header_timeout = float(os.environ.get(HEADER_TIMEOUT_ENV, _DEFAULT_HEADER_TIMEOUT))
        self._max_header_bytes = int(
            os.environ.get(MAX_HEADER_BYTES_ENV, _DEFAULT_MAX_HEADER_BYTES)
        )
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        waiting = self._header_deadline is not None
        super().data_received(data)
        if not waiting or self._header_deadline is None:
            return
        if self.cycle is not self._armed_cycle:
            self._header_deadline = None  # the headers are complete
            return
        # httptools sets no limit of its own: headers could grow the memory of one
        # connection without bound.
        self._header_bytes += len(data)
        if self._header_bytes > self._max_header_bytes and not self.transport.is_closing():
            self._disarm_header_timer()
            self.transport.write(_TOO_LARGE % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY))
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self._arm_header_timer()

    def handle_websocket_upgrade(self, *event: Any) -> None:
        # The connection is a WebSocket's from here (the Responses socket): its own
        # protocol keeps it (pings), and a long answer must not cost it its socket.
        self._disarm_header_timer()
        super().handle_websocket_upgrade(*event)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._armed_cycle = self.cycle
        self._header_bytes = 0
        deadline = self.loop.time() + self._header_timeout
        self._header_deadline = deadline
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(deadline, self._header_timer_fired)

    def _disarm_header_timer(self) -> None:
        self._header_deadline = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timer_fired(self) -> None:
        self._header_timer = None
        deadline = self._header_deadline
        if deadline is None:
            return  # the headers came in time; the next answer's end arms it again
        if deadline > self.loop.time():
            # Re-armed since this timer was set (a later request): wait for that one.
            self._header_timer = self.loop.call_at(deadline, self._header_timer_fired)
            return
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class HttpToolsWithHeaderTimeout(_HeaderTimeout, HttpToolsProtocol):
    """uvicorn's httptools protocol (its choice when ``uvicorn[standard]`` is
    installed, as trimproxy requires) with the header timeout; what ``serve`` runs."""


class H11WithHeaderTimeout(_HeaderTimeout, H11Protocol):
    """uvicorn's h11 protocol with the header timeout."""
