"""The upstream's read timeout over a relayed body, kept lazily (``ReadDeadline``)."""

from __future__ import annotations

import asyncio

import aiohttp


class ReadDeadline:
    """The upstream's read timeout over a relayed body, kept lazily.

    aiohttp's ``sock_read`` cancels and re-arms a loop timer on every read, which on
    a stream is every SSE event. Here the relay only notes in ``last`` the loop time
    at which it went back to waiting for the upstream (None while it is sending to
    its client: a client that reads slowly holds the relay up, not the upstream);
    one timer fires at the deadline of the wait it was armed for and, when a newer
    wait began meanwhile, re-arms for that one's. The stream fails when the upstream
    has sent nothing for ``TRIMPROXY_READ_TIMEOUT`` while the relay waited, with an
    ``aiohttp.ServerTimeoutError`` (the class of aiohttp's own), at one timer per idle
    spell instead of one per event.
    """

    __slots__ = ("_handle", "_loop", "_stream", "_timeout", "last")

    def __init__(self, stream: aiohttp.StreamReader, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stream = stream
        self._timeout = timeout
        self.last: float | None = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(
            self.last + timeout, self._check
        )

    @classmethod
    def take_over(cls, response: aiohttp.ClientResponse) -> ReadDeadline | None:
        """Take the read timeout of ``response``'s connection from aiohttp (as aiohttp
        does itself for websockets); None when it has none, and aiohttp keeps it."""
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        timeout = getattr(protocol, "read_timeout", None)
        if protocol is None or not timeout:
            return None
        # aiohttp sets it again for the connection's next request.
        protocol.read_timeout = None
        return cls(response.content, timeout)

    def _check(self) -> None:
        now = self._loop.time()
        last = self.last
        due = (now if last is None else last) + self._timeout
        if now < due:  # sending to the client, or a newer wait since the timer was armed
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self._stream.set_exception(
            aiohttp.ServerTimeoutError("Timeout on reading data from socket")
        )

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
