"""Send one chat request to its engine: route, reserve, forward, fail over once.

The request's engine is the first of its order (``Upstream.order``: the session's
rendezvous order under ``TRIMPROXY_ROUTING=session``). With KV admission it reserves on
that engine's own ledger and waits for that engine (never spills to another while it
only waits: that would cost the turn its prefix hits). When the connection to it
fails before anything was sent (refused, or not opened in time), the engine leaves the
rotation and the request is sent once more, to the next engine of its order, with a
reservation there. A failure after the request went out is not retried: the engine
may have acted on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
from starlette.requests import Request

from proxy.admission import Need, Reservation
from proxy.chat import ChatRequest
from proxy.dependencies import Services
from proxy.engines.engine import Engine
from proxy.errors import ProxyError
from proxy.logs import RequestFacts
from proxy.sessions.identity import identify
from proxy.upstream import Upstream, connection_failed

log = logging.getLogger("trimproxy.engines")


@dataclass(slots=True)
class Sent:
    """A forwarded chat request: the engine's response head and what it holds."""

    response: aiohttp.ClientResponse
    engine: Engine
    reservation: Reservation | None
    started: float
    """``perf_counter()`` when it was forwarded (the TTFB clock)."""
    _done: bool = False

    def done(self) -> None:
        """The answer is over, however it ended: give back what it held (idempotent)."""
        if self._done:
            return
        self._done = True
        self.engine.in_flight -= 1
        if self.reservation is not None:
            self.reservation.release()


def routing_key(
    request: Request, svc: Services, chat: ChatRequest, known: str | None = None
) -> str | None:
    """The session identity that ``session`` routing hashes; None when nothing to pick.
    ``known``: the identity the session step worked out already (one hash a request)."""
    if svc.settings.routing != "session" or len(svc.upstream.engines.live()) < 2:
        return None
    if known is not None:
        return known
    return identify(request.headers, svc.settings.session_header, chat.user, chat.messages).key


async def send_alone(
    upstream: Upstream,
    engine: Engine,
    path: str,
    headers: dict[str, str],
    body: bytes,
    client_gone: asyncio.Future[None],
    facts: RequestFacts,
) -> aiohttp.ClientResponse:
    """The chat request of an upstream that is one engine without a KV ledger
    (``Upstream.lone``): nothing to route, weigh, reserve or fail over to, so none of
    ``send_chat``'s bookkeeping; cancels ``client_gone`` when it fails."""
    facts.engine = engine.label
    try:
        return await upstream.send(engine, "POST", path, headers, body, client_gone)
    except BaseException:
        client_gone.cancel()
        raise


async def send_chat(
    request: Request,
    svc: Services,
    chat: ChatRequest,
    path: str,
    headers: dict[str, str],
    body: bytes,
    need: Need,
    client_gone: asyncio.Future[None],
    facts: RequestFacts,
    session_key: str | None = None,
) -> Sent:
    """Forward the chat request (``need``: what it may hold in the KV cache) to its
    engine; cancels ``client_gone`` when it fails. ``session_key``: the session step's
    identity of the request, when it has one."""
    upstream = svc.upstream
    key = routing_key(request, svc, chat, session_key)
    try:
        order = upstream.order(key)
    except BaseException:
        client_gone.cancel()
        raise
    for attempt, engine in enumerate(order[:2]):
        reservation = None
        try:
            if engine.admission is not None:
                reservation = await engine.admission.admit_while_connected(need, client_gone)
            engine.in_flight += 1
            started = time.perf_counter()
            try:
                response = await upstream.send(engine, "POST", path, headers, body, client_gone)
            except BaseException:
                engine.in_flight -= 1
                raise
        except ProxyError as exc:
            if reservation is not None:
                reservation.release()
            if attempt == 0 and len(order) > 1 and connection_failed(exc):
                log.info("engine %s refused; retrying on %s", engine.label, order[1].label)
                continue
            client_gone.cancel()
            facts.engine = engine.label
            raise
        except BaseException:
            if reservation is not None:
                reservation.release()
            client_gone.cancel()
            raise
        facts.engine = engine.label
        if attempt:
            upstream.router.retried(key, engine)
        return Sent(response, engine, reservation, started)
    raise AssertionError("unreachable: the last attempt returns or raises")
