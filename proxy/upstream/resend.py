"""A forwarded request whose send failed: sent once more on a fresh connection when
its connection was closed before any of its answer came, else the failure to answer.

Kept apart from ``Transport.send``, which runs on every request: this runs only when
a send fails. aiohttp sends an idempotent request once more itself; a chat POST on a
kept-alive connection that the engine was just closing would fail otherwise
(docs/engines.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import aiohttp
from yarl import URL

from proxy.engines.engine import Engine
from proxy.errors import ProxyError, closed_before_answer
from proxy.upstream.calls import connection_failed, dropped

log = logging.getLogger("trimproxy.upstream")

TRANSPORT_ERRORS = (TimeoutError, aiohttp.ClientError, OSError)
#: Methods aiohttp sends once more itself when a kept-alive connection fails.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class Marks(Protocol):
    """What a failed send tells the transport (``proxy.upstream.transport.Transport``)."""

    def engine_failed(self, engine: Engine, reason: str) -> None: ...

    def failure(
        self,
        exc: BaseException,
        answer: aiohttp.ClientResponse | None = None,
        *,
        origin: str | None = None,
    ) -> ProxyError: ...

    def counted(self, error: ProxyError) -> ProxyError: ...


class Resend:
    """The failed sends of one transport; ``on_retry`` counts the requests sent once
    more, by reason."""

    def __init__(
        self, timeout: aiohttp.ClientTimeout, on_retry: Callable[[str], None] | None
    ) -> None:
        self._timeout = timeout
        self._on_retry = on_retry
        self._session: aiohttp.ClientSession | None = None

    async def failed(
        self,
        marks: Marks,
        exc: BaseException,
        engine: Engine,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        body: bytes | None,
        skip: tuple[str, ...] | None,
    ) -> aiohttp.ClientResponse:
        """The answer sent once more when ``exc`` dropped the connection before any of
        it came, else the failure raised; a connection that fails takes the engine out
        of the rotation now, not at its next probe (docs/architecture.md §20)."""
        if not dropped(exc) or method in IDEMPOTENT_METHODS:
            failure = marks.failure(exc, origin=engine.url)
            if connection_failed(exc):
                marks.engine_failed(engine, failure.kind or "connect")
            raise failure from exc
        if self._on_retry is not None:
            self._on_retry("disconnected")
        log.info(
            "engine %s closed the connection before answering; sending once more on a "
            "fresh connection",
            engine.label,
        )
        try:
            return await self._fresh().request(
                method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=skip,
            )
        except TRANSPORT_ERRORS as again:
            if connection_failed(again):
                marks.engine_failed(engine, "connect")
                then = "and refused a new connection"
            elif dropped(again):
                then = "and again on a fresh connection"
            else:
                raise marks.failure(again, origin=engine.url) from again
            raise marks.counted(closed_before_answer(engine.url, then)) from again

    def _fresh(self) -> aiohttp.ClientSession:
        """A session whose every request opens a new connection. Never a third try."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=self._timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
