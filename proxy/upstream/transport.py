"""The transport: the one aiohttp session, what goes with every call, and what a
failure means for the engine it reached.

As httpx's transport sits under its ``Client``, ``Transport`` sits under
``proxy.upstream.Upstream``: it sends one request to one engine (an engine is only a
base URL) with the proxy's defaults, the upstream key (``TRIMPROXY_UPSTREAM_API_KEY``)
and the configured connect and read timeouts; maps what the HTTP client raises to the
502 or 504 to answer, counted once (``trimproxy_upstream_errors_total{kind}``); and
marks the engine down when a connection fails and up when a call reaches it
(docs/architecture.md §20). Which engine to ask, and the next one on a refusal, is the
client's (``proxy.upstream.failover``). Nothing else in the proxy sees the session.

aiohttp rather than httpx: on this 2-core machine httpx's default transport costs
about 3x the CPU of an aiohttp client per proxied request (docs/performance.md), and
the client is most of what a proxy spends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson
from yarl import URL

import proxy
from proxy.engines.engine import Engine
from proxy.errors import (
    ClientClosedRequest,
    ProxyError,
    broken_off,
    deadline_passed,
    protocol_error,
    upstream_failure,
)
from proxy.hop import HOP_BY_HOP, CancelOnDisconnect
from proxy.metrics import KNOWN_ROUTES
from proxy.settings import Settings
from proxy.types import JSON_MEDIA_TYPE
from proxy.upstream.calls import UpstreamCallFailed, connection_failed, invalid_head
from proxy.upstream.deadline import SHARED_FROM, head_within
from proxy.upstream.resend import TRANSPORT_ERRORS, Resend

log = logging.getLogger("trimproxy.upstream")

_REQUEST_DROP = HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "expect",
    # Credentials that are never the model server's: a browser's cookies for the
    # proxy's site, and an API key in the header other gateways use, which travels
    # (like Authorization) only through a transparent proxy.
    "cookie",
    "x-api-key",
}
_JSON_HEADERS = {"content-type": JSON_MEDIA_TYPE}
# Bodies pass through as the upstream encoded them (the client's Accept-Encoding goes
# up as it is); a client that named none gets no compression it did not ask for.
_IDENTITY = "identity"
_SKIP_TYPE = ("Content-Type",)

#: Told the ``kind`` of every failure of a forwarded request (``Transport.failure``).
ErrorHook = Callable[[str], None]
#: Seconds an idle upstream connection is kept for reuse (below uvicorn's 5 s).
IDLE_KEEPALIVE = 4.0


class Transport:
    """One aiohttp session and the defaults of one upstream setting."""

    def __init__(
        self,
        settings: Settings,
        *,
        on_error: ErrorHook | None = None,
        lone: Engine | None = None,
        on_retry: ErrorHook | None = None,
    ) -> None:
        """``on_error``: counts the failures of forwarded requests; ``lone``: the engine
        of an upstream that nothing probes (its log line says what brings it back);
        ``on_retry``: counts the requests sent once more (``proxy.upstream.resend``),
        by reason."""
        self.base_url = settings.upstream_url
        self.lone = lone
        self.health_interval = settings.health_interval
        self.connect_timeout = settings.connect_timeout
        self.read_timeout = settings.read_timeout
        self._on_error = on_error
        key = settings.upstream_api_key
        self._auth: dict[str, str] = {"authorization": f"Bearer {key}"} if key else {}
        self._user_agent = f"trimproxy/{proxy.__version__}"
        # The proxy's own calls read and parse what they get: never compressed.
        self._own_headers = {
            **self._auth,
            "accept-encoding": _IDENTITY,
            "user-agent": self._user_agent,
        }
        # The client's own Authorization travels only through an open proxy with no
        # upstream key: then the proxy is transparent to an upstream checking keys.
        self.pass_client_auth = not settings.api_key_set and not key
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        self._resend = Resend(self.timeout, on_retry)
        self._session = aiohttp.ClientSession(
            # An idle connection is dropped after 4 s, before the engine's own server
            # drops it (uvicorn's 5 s, vLLM's and FastChat's default); a request sent on a
            # connection the engine is just closing anyway is sent once more on a fresh
            # one (``proxy.upstream.resend``, docs/engines.md).
            connector=aiohttp.TCPConnector(
                limit=0, keepalive_timeout=IDLE_KEEPALIVE, ttl_dns_cache=300
            ),
            timeout=self.timeout,
            # Bodies pass through as the upstream encoded them.
            auto_decompress=False,
            # One session serves every client: a cookie one answer set must never go
            # up with another client's request (and filtering a jar costs on each).
            cookie_jar=aiohttp.DummyCookieJar(),
            # No skip_auto_headers: aiohttp would rebuild that list on every request.
            # request_headers() names the encoding and the agent itself instead.
        )

    def request_headers(self, raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
        """Headers to send upstream: hop-by-hop dropped, the key replaced.

        A key the proxy checked (``TRIMPROXY_API_KEYS``) is the proxy's own and never
        leaves it; the upstream key is sent in its place when set.
        """
        keep_client_auth = self.pass_client_auth
        out: dict[str, str] = {}
        named: list[str] = []
        for name_b, value_b in raw:
            name = name_b.decode("latin-1").lower()
            if name in _REQUEST_DROP:
                if name in ("authorization", "x-api-key") and keep_client_auth:
                    out[name] = value_b.decode("latin-1")
                elif name == "connection":
                    named.extend(value_b.decode("latin-1").split(","))
                continue
            out[name] = value_b.decode("latin-1")
        # RFC 9110 7.6.1: the headers the client's Connection names are hop-by-hop too.
        for token in named:
            out.pop(token.strip().lower(), None)
        out.update(self._auth)
        if "accept-encoding" not in out:
            out["accept-encoding"] = _IDENTITY
        if "user-agent" not in out:
            out["user-agent"] = self._user_agent
        return out

    # -- health marks ------------------------------------------------------------

    def engine_failed(self, engine: Engine, reason: str) -> None:
        """Take ``engine`` out of the rotation (it refused or timed out on connect)."""
        if engine.health.failed(time.monotonic(), reason, self.health_interval):
            if engine is self.lone:
                log.warning(
                    "engine %s is down (%s); the next request or readiness check that "
                    "reaches it brings it back",
                    engine.label,
                    reason,
                )
            else:
                log.warning(
                    "engine %s left the rotation (%s); probing it until it answers",
                    engine.label,
                    reason,
                )
        engine.state_known()

    def engine_answered(self, engine: Engine, asked_in: int | None = None) -> None:
        """Back in (or still in) the rotation: a request to it, sent in failure epoch
        ``asked_in``, was answered (``Health.answered``): its health probe, or, for an
        engine that nothing probes (``lone``), any call that reached it."""
        if engine.health.answered(time.monotonic(), self.health_interval, asked_in):
            log.info("engine %s answers again and rejoins the rotation", engine.label)
        engine.state_known()

    # -- sending -----------------------------------------------------------------

    async def send(
        self,
        engine: Engine,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        client_gone: asyncio.Future[None] | None = None,
        count_spent: float = 0.0,
    ) -> aiohttp.ClientResponse:
        """Send a request to ``engine`` and return once the response head has arrived.

        ``headers`` come from ``request_headers`` (the key is in them already). A
        non-streaming answer's head comes only when generation is done, so the
        client's disconnect (``client_gone``) is raced against the wait: when the
        client leaves first, the request is cancelled, which closes the upstream
        connection and lets the server abort the generation. A connection that fails
        takes the engine out of the rotation, one closed before any answer byte is
        sent once more on a fresh connection (``proxy.upstream.resend``). The head shares
        one deadline with the request's count, which took ``count_spent`` seconds
        (``Prepared.counted_in``, ``proxy.upstream.deadline``).
        """
        url = engine.urls.get(path)
        if url is None:
            url = _url(engine, path)
        if count_spent >= self.read_timeout:  # the count took it all: not sent at all
            raise self.counted(deadline_passed(engine.url, self.read_timeout, count_spent))
        engine.sent()
        asked_in = engine.health.epoch
        # A body sent without a type goes up without one, not as aiohttp's octet-stream.
        skip = _SKIP_TYPE if body is not None and "content-type" not in headers else None
        with CancelOnDisconnect(client_gone) as watch:
            try:
                # session.request inline: a Python frame less (docs/performance.md §6).
                request = self._session.request(
                    method, url, headers=headers, data=body, allow_redirects=False,
                    skip_auto_headers=skip,
                )  # fmt: skip
                if count_spent < SHARED_FROM:
                    response = await request
                elif (got := await head_within(request, self.read_timeout - count_spent)) is None:
                    raise self.counted(deadline_passed(engine.url, self.read_timeout, count_spent))
                else:
                    response = got
            except TRANSPORT_ERRORS as exc:
                response = await self._resend.failed(
                    self, exc, engine, method, url, headers, body, skip
                )
            problem = invalid_head(response)
            if problem is not None:
                response.close()
                raise self.counted(protocol_error(engine.url, problem))
            if response.status >= 500:
                if self._on_error is not None:
                    self._on_error("http_5xx")  # relayed as it is, but the upstream failed
            elif not engine.health.up:
                self.engine_answered(engine, asked_in)
            return response
        assert watch.fired  # only a disconnect ends the block without a return
        raise ClientClosedRequest("The client closed the connection before the answer.")

    def failure(
        self,
        exc: BaseException,
        answer: aiohttp.ClientResponse | None = None,
        *,
        origin: str | None = None,
    ) -> ProxyError:
        """What the HTTP client raised on a forwarded request, as the 502 or 504 to
        answer, and counted: the one place upstream failures are counted. ``answer``:
        the response whose body broke off (``proxy.pipeline.relay``)."""
        if answer is None:
            where = origin or self.base_url
            error = upstream_failure(exc, where, self.read_timeout, self.connect_timeout)
        else:
            error = broken_off(exc, str(answer.url.origin()))
        return self.counted(error)

    def counted(self, error: ProxyError) -> ProxyError:
        """``error``, counted by its kind."""
        if self._on_error is not None and error.kind is not None:
            self._on_error(error.kind)
        return error

    async def call(
        self,
        engine: Engine,
        method: str,
        path: str,
        payload: Any = None,
        *,
        max_bytes: int = 16 << 20,
        timeout: aiohttp.ClientTimeout | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """One of the proxy's own small calls to ``engine``, with the key and the
        configured timeouts: the body of a 200, else ``UpstreamCallFailed``."""
        sent = {**self._own_headers, **(headers or {})}
        data = None
        if payload is not None:
            data = orjson.dumps(payload)
            sent.update(_JSON_HEADERS)
        asked_in = engine.health.epoch
        try:
            async with self._session.request(
                method,
                engine.url + path,
                data=data,
                headers=sent,
                timeout=timeout or self.timeout,
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    reason = "http_404" if resp.status == 404 else "http_error"
                    raise UpstreamCallFailed(path, resp.status, reason)
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > max_bytes:
                        raise UpstreamCallFailed(path, resp.status, "too_large")
                if not engine.health.up:
                    self.engine_answered(engine, asked_in)
                return bytes(body)
        except TRANSPORT_ERRORS as exc:
            if connection_failed(exc):
                self.engine_failed(engine, "connect")
            raise UpstreamCallFailed(path, None, type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self._session.close()
        await self._resend.aclose()


def _url(engine: Engine, path: str) -> URL:
    """``path`` on ``engine``, kept for the routes that carry the traffic."""
    # encoded=True: the path is in normal form already (proxy.paths) and goes out
    # byte for byte; yarl would otherwise resolve dot segments and re-quote.
    url = URL(engine.url + path, encoded=True)
    if path in KNOWN_ROUTES:
        engine.urls[path] = url
    return url
