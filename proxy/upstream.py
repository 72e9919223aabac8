"""Talking to the upstream model server: the one HTTP client, and context windows.

``Upstream`` owns the only aiohttp session of the proxy and its defaults, the way
httpx's ``Client`` applies its own to every request: the base URL, the upstream key
(``TRIMPROXY_UPSTREAM_API_KEY``) and the configured connect and read timeouts go
with every call, forwarded or the proxy's own (``/v1/models``, ``/tokenize``,
``/metrics``, readiness). Nothing else in the proxy ever sees the session.

aiohttp rather than httpx: on this 2-core machine httpx's default transport costs
about 3x the CPU of an aiohttp client per proxied request (``bench/overhead.py``),
and the client is most of what a proxy spends. Relaying the answer back is
``proxy.relay``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

import proxy
from proxy.engines.discovery import Discovery, DnsResolver, parse_dns_url
from proxy.engines.engine import Engine
from proxy.engines.holdings import MemoryHoldings
from proxy.engines.pool import EngineList, StaticEngines
from proxy.engines.routing import Router
from proxy.engines.served import ServedModel, merge_served
from proxy.errors import (
    ClientClosedRequest,
    NoEngineAvailable,
    ProxyError,
    broken_off,
    protocol_error,
    upstream_failure,
)
from proxy.metrics import KNOWN_ROUTES
from proxy.relay import HOP_BY_HOP, CancelOnDisconnect
from proxy.settings import Settings
from proxy.types import JSON_MEDIA_TYPE

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
_TRANSPORT_ERRORS = (TimeoutError, aiohttp.ClientError, OSError)

#: Told the ``kind`` of every failure of a forwarded request (``Upstream.failure``).
ErrorHook = Callable[[str], None]


class UpstreamCallFailed(Exception):
    """One of the proxy's own calls (``/tokenize``, ``/metrics``, …) did not succeed.

    ``status`` is the HTTP status when the upstream answered, None when it was not
    reached or timed out; ``reason`` is a short bounded word for logs and states
    (``http_404``, ``http_error``, ``too_large``, ``unparsable``, or the transport
    error's class name).
    """

    def __init__(self, path: str, status: int | None, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Tokenized:
    """What vLLM's ``POST /tokenize`` answered."""

    count: int
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: str
    engines_up: int = 1
    engines: int = 1


def invalid_head(response: aiohttp.ClientResponse) -> str | None:
    """What is wrong with an answer's head that the proxy cannot relay, or None.

    aiohttp accepts any three-digit status and decodes header values as UTF-8; an
    ASGI server can send neither a status outside 100-599 nor a header that is not
    Latin-1, and would drop the connection instead.
    """
    if not 100 <= response.status <= 599:
        return f"HTTP status {response.status}"
    for value in response.headers.values():
        if not value.isascii():
            try:
                value.encode("latin-1")
            except UnicodeEncodeError:
                return "a header value that is not Latin-1"
    return None


def parse_models(data: Any) -> tuple[ServedModel, ...]:
    """The one reader of a ``/v1/models`` body; entries without an ``id`` are skipped."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return ()
    out: list[ServedModel] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        root = entry.get("root")
        length = entry.get("max_model_len")
        out.append(
            ServedModel(
                id=entry["id"],
                root=root if isinstance(root, str) and root else None,
                max_model_len=length
                if isinstance(length, int) and not isinstance(length, bool) and length > 0
                else None,
            )
        )
    return tuple(out)


def connection_failed(exc: BaseException) -> bool:
    """Whether a forwarding failure happened before anything was sent: the connection
    was refused or did not open in time. Only such a request may go to another engine
    (one whose bytes went out may have been acted on)."""
    cause = exc.__cause__ if isinstance(exc, ProxyError) else exc
    return isinstance(cause, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))


#: Seconds an idle upstream connection is kept for reuse (below uvicorn's 5 s).
IDLE_KEEPALIVE = 4.0


class Upstream:
    """The shared client of one upstream setting and its engines (one or several:
    ``proxy.engines``); built once in the lifespan, closed with it. Every engine is
    talked to through the one session: an engine is only a base URL."""

    def __init__(
        self,
        settings: Settings,
        *,
        engines: EngineList | None = None,
        on_error: ErrorHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_error``: counts the failures of forwarded requests
        (``trimproxy_upstream_errors_total{kind}``); None counts nothing. ``clock``
        says when the cached list of served models and its backoff run out (tests)."""
        self.base_url = settings.upstream_url
        """The setting as written (one URL, or several comma-separated)."""
        self.discovery: Discovery | None = None
        """The DNS lookups of a ``dns+http://`` upstream (``start_discovery``)."""
        name = parse_dns_url(settings.upstream_url)
        self.lone: Engine | None = None
        """The engine of an upstream that is one URL for good (no list, no DNS): its
        chat requests skip routing, and nothing probes it; the calls that reach it
        bring it back (docs/architecture.md §20)."""
        if engines is None:
            engines = StaticEngines([] if name else settings.upstream_url.split(","))
            if name is None and len(engines.all()) == 1:
                self.lone = engines.all()[0]
        self.engines: EngineList = engines
        if name is not None:
            resolver = DnsResolver(settings.dns_nameserver)
            self.discovery = Discovery(name, resolver, settings.upstream_refresh, engines.replace)
        holdings = MemoryHoldings(settings.routing_session_idle, settings.session_max_entries)
        self.router = Router(settings.routing, settings.routing_load_factor, holdings)
        self.health_interval = settings.health_interval
        self._said: set[tuple[str, str]] = set()
        self._on_error = on_error
        self.connect_timeout = settings.connect_timeout
        self.read_timeout = settings.read_timeout
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
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        self._session = aiohttp.ClientSession(
            # An idle connection is dropped after 4 s, before the engine's own server
            # drops it (uvicorn's 5 s, vLLM's and FastChat's default): a request sent on a
            # connection the engine is just closing fails, and is not retried, since the
            # proxy cannot tell that nothing reached the engine (docs/engines.md).
            connector=aiohttp.TCPConnector(
                limit=0, keepalive_timeout=IDLE_KEEPALIVE, ttl_dns_cache=300
            ),
            timeout=self._timeout,
            # Bodies pass through as the upstream encoded them.
            auto_decompress=False,
            # One session serves every client: a cookie one answer set must never go
            # up with another client's request (and filtering a jar costs on each).
            cookie_jar=aiohttp.DummyCookieJar(),
            # No skip_auto_headers: aiohttp would rebuild that list on every request.
            # request_headers() names the encoding and the agent itself instead.
        )
        self._models: tuple[tuple[ServedModel, ...], float] | None = None
        self._models_pending: asyncio.Future[tuple[ServedModel, ...]] | None = None
        self._models_ttl = settings.models_refresh
        self._models_retry_after = settings.models_retry
        self._models_failures = 0
        self._clock = clock

    # -- forwarding -------------------------------------------------------------

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

    # -- engines -------------------------------------------------------------------

    def order(self, key: str | None = None) -> Sequence[Engine]:
        """The engines a request tries, first choice first (``TRIMPROXY_ROUTING``).

        One configured engine is always tried, up or not: there is nothing to fail
        over to, and its own error (502, 504) names it. With several and none up,
        503 ``no_engine_available``.
        """
        live = self.engines.live()
        if not live:
            every = self.engines.all()
            if len(every) == 1:
                return every
            raise NoEngineAvailable(
                f"None of the {len(every)} engines of {self.base_url} is up (each failed to "
                f"connect or its health probe); they are probed every "
                f"{self.health_interval:g} s at most (TRIMPROXY_HEALTH_INTERVAL). Retry shortly.",
                headers={"retry-after": str(max(1, min(30, round(self.health_interval))))},
            )
        return self.router.order(live, key)

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

    async def forward(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        client_gone: asyncio.Future[None] | None = None,
        engine: Engine | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request to ``engine`` (else the next in the rotation, retried once on
        another when the connection failed before anything was sent); return once the
        response head has arrived."""
        if engine is not None:
            return await self.send(engine, method, path, headers, body, client_gone)
        order = self.order()
        try:
            return await self.send(order[0], method, path, headers, body, client_gone)
        except ProxyError as exc:
            if len(order) < 2 or not connection_failed(exc):
                raise
        return await self.send(order[1], method, path, headers, body, client_gone)

    async def send(
        self,
        engine: Engine,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        client_gone: asyncio.Future[None] | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request to ``engine`` and return once the response head has arrived.

        ``headers`` come from ``request_headers`` (the key is in them already). A
        non-streaming answer's head comes only when generation is done, so the
        client's disconnect (``client_gone``) is raced against the wait: when the
        client leaves first, the request is cancelled, which closes the upstream
        connection and lets the server abort the generation. A connection that fails
        takes the engine out of the rotation.
        """
        # encoded=True: the path is in normal form already (proxy.paths) and goes out
        # byte for byte; yarl would otherwise resolve dot segments and re-quote.
        url = engine.urls.get(path)
        if url is None:
            url = URL(engine.url + path, encoded=True)
            if path in KNOWN_ROUTES:  # built once for the routes that carry the traffic
                engine.urls[path] = url
        engine.sent()
        asked_in = engine.health.epoch
        # A body the client sent without a type goes up without one, not as the
        # application/octet-stream aiohttp would name it.
        skip = _SKIP_TYPE if body is not None and "content-type" not in headers else None
        with CancelOnDisconnect(client_gone) as watch:
            try:
                response = await self._session.request(
                    method,
                    url,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                    skip_auto_headers=skip,
                )
            except _TRANSPORT_ERRORS as exc:
                failure = self.failure(exc, origin=engine.url)
                # ``exc``, not ``failure``: the ProxyError gets its __cause__ only when
                # raised below, and without this the engine stayed in the rotation
                # until its next probe (docs/architecture.md §20, Dispatch).
                if connection_failed(exc):
                    self.engine_failed(engine, failure.kind or "connect")
                raise failure from exc
            problem = invalid_head(response)
            if problem is not None:
                response.close()
                raise self._counted(protocol_error(engine.url, problem))
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
        answer, and counted: with ``forward``'s, the one place upstream failures are
        counted. ``answer``: the response whose body broke off (``proxy.relay``)."""
        if answer is None:
            where = origin or self.base_url
            error = upstream_failure(exc, where, self.read_timeout, self.connect_timeout)
        else:
            error = broken_off(exc, str(answer.url.origin()))
        return self._counted(error)

    def _counted(self, error: ProxyError) -> ProxyError:
        if self._on_error is not None and error.kind is not None:
            self._on_error(error.kind)
        return error

    # -- the proxy's own calls ----------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        max_bytes: int = 16 << 20,
        timeout: aiohttp.ClientTimeout | None = None,
        headers: Mapping[str, str] | None = None,
        engine: Engine | None = None,
    ) -> bytes:
        """One small request with the key and the configured timeouts; the body of a
        200, else ``UpstreamCallFailed``. Without ``engine``, any live engine: the
        next one is asked when the first cannot be reached."""
        if engine is not None:
            return await self._call_engine(
                engine, method, path, payload, max_bytes, timeout, headers
            )
        try:
            order = self.order()
        except NoEngineAvailable:
            raise UpstreamCallFailed(path, None, "no_engine") from None
        try:
            return await self._call_engine(
                order[0], method, path, payload, max_bytes, timeout, headers
            )
        except UpstreamCallFailed as exc:
            if len(order) < 2 or exc.status is not None:
                raise
        return await self._call_engine(order[1], method, path, payload, max_bytes, timeout, headers)

    async def _call_engine(
        self,
        engine: Engine,
        method: str,
        path: str,
        payload: Any,
        max_bytes: int,
        timeout: aiohttp.ClientTimeout | None,
        headers: Mapping[str, str] | None,
    ) -> bytes:
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
                timeout=timeout or self._timeout,
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
        except _TRANSPORT_ERRORS as exc:
            if connection_failed(exc):
                self.engine_failed(engine, "connect")
            raise UpstreamCallFailed(path, None, type(exc).__name__) from exc

    async def _call_json(
        self, method: str, path: str, payload: Any = None, engine: Engine | None = None
    ) -> Any:
        raw = await self._call(method, path, payload, engine=engine)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamCallFailed(path, 200, "unparsable") from exc

    async def models(self) -> tuple[ServedModel, ...]:
        """The served models, from ``GET /v1/models``; cached, one request at a time.

        Empty when the upstream cannot be asked; that is cached for a short while
        only, so a restarting upstream is neither hammered nor forgotten.
        """
        now = self._clock()
        if self._models is not None and self._models[1] > now:
            return self._models[0]
        if self._models_pending is not None:
            return await asyncio.shield(self._models_pending)
        future: asyncio.Future[tuple[ServedModel, ...]] = asyncio.get_running_loop().create_future()
        self._models_pending = future
        try:
            found = await self._served()
            if found:
                self._models_failures = 0
                ttl = self._models_ttl
            else:
                # Backoff: TRIMPROXY_MODELS_RETRY, twice that, ... up to TRIMPROXY_MODELS_REFRESH.
                ttl = min(
                    self._models_ttl, self._models_retry_after * 2 ** min(self._models_failures, 16)
                )
                self._models_failures += 1
            self._models = (found, now + ttl)
            future.set_result(found)
            return found
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            self._models_pending = None

    async def _served(self) -> tuple[ServedModel, ...]:
        """Every engine's ``/v1/models`` in one list (``merge_served``); those that
        cannot be asked are left out."""
        engines = self.engines.live() or self.engines.all()
        if len(engines) == 1:
            return await self._served_by(engines[0])
        lists = await asyncio.gather(*(self._served_by(e) for e in engines))
        return merge_served([(e.label, m) for e, m in zip(engines, lists, strict=True)], self._said)

    async def _served_by(self, engine: Engine) -> tuple[ServedModel, ...]:
        try:
            return parse_models(await self._call_json("GET", "/v1/models", engine=engine))
        except UpstreamCallFailed as exc:
            log.debug("GET /v1/models of %s failed: %s", engine.label, exc.reason)
            return ()

    async def tokenize(
        self,
        messages: Sequence[Any],
        model: str | None,
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> Tokenized:
        """vLLM's ``POST /tokenize`` in its chat form; ``UpstreamCallFailed`` on error."""
        body: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        if model is not None:
            body["model"] = model
        if tools:
            body["tools"] = list(tools)
        data = await self._call_json("POST", "/tokenize", body)
        if not isinstance(data, dict):
            raise UpstreamCallFailed("/tokenize", 200, "unparsable")
        count = data.get("count")
        if not isinstance(count, int):
            tokens = data.get("tokens")
            if not isinstance(tokens, list):
                raise UpstreamCallFailed("/tokenize", 200, "unparsable")
            count = len(tokens)
        limit = data.get("max_model_len")
        return Tokenized(count, limit if isinstance(limit, int) and limit > 0 else None)

    async def token_check(self, model: str) -> int | None:
        """FastChat's context length (``POST /api/v1/token_check``); None if not told."""
        try:
            checked = await self._call_json(
                "POST",
                "/api/v1/token_check",
                {"prompts": [{"model": model, "prompt": "", "max_tokens": 0}]},
            )
        except UpstreamCallFailed:
            return None
        prompts = checked.get("prompts") if isinstance(checked, dict) else None
        if isinstance(prompts, list) and prompts and isinstance(prompts[0], dict):
            length = prompts[0].get("contextLength")
            if isinstance(length, int) and length > 0:
                return length
        return None

    async def metrics_text(
        self, *, max_bytes: int, timeout: float | None = None, engine: Engine | None = None
    ) -> str:
        """An engine's own ``GET /metrics`` page; ``UpstreamCallFailed`` on error.

        ``timeout`` caps the whole call besides the configured connect and read
        timeouts (the scraper keeps one scrape shorter than its interval).
        """
        bound = None
        if timeout is not None:
            bound = aiohttp.ClientTimeout(
                total=timeout, connect=self.connect_timeout, sock_read=self.read_timeout
            )
        raw = await self._call(
            "GET",
            "/metrics",
            max_bytes=max_bytes,
            timeout=bound,
            engine=engine or self.engines.all()[0],
        )
        return raw.decode("utf-8", errors="replace")

    async def ready(self) -> Readiness:
        """Whether the upstream serves us: every engine's ``GET /v1/models``; ready when
        one of them is (the detail says how many)."""
        engines = self.engines.all()
        if len(engines) == 1:
            return await self.engine_ready(engines[0])
        answers = await asyncio.gather(*(self.engine_ready(e) for e in engines))
        up = sum(a.ready for a in answers)
        detail = f"{up} of {len(engines)} engines answer GET /v1/models"
        down = [
            f"{e.label}: {a.detail}" for e, a in zip(engines, answers, strict=True) if not a.ready
        ]
        if down:
            detail += "; " + "; ".join(down[:8])
        return Readiness(up > 0, detail, up, len(engines))

    async def engine_ready(self, engine: Engine) -> Readiness:
        """Whether ``engine`` serves us: ``GET /v1/models`` with the key.

        401/403 is not ready (the key is missing or wrong: nothing would be trimmed
        and every request would fail), nor is a 5xx or no answer at all.
        """
        try:
            await self._call("GET", "/v1/models", engine=engine)
        except UpstreamCallFailed as exc:
            if exc.status is None:
                return Readiness(False, f"GET /v1/models got no answer ({exc.reason})", 0)
            if exc.status in (401, 403):
                return Readiness(
                    False,
                    f"GET /v1/models answered HTTP {exc.status}: set TRIMPROXY_UPSTREAM_API_KEY "
                    "to the key the upstream expects",
                    0,
                )
            if exc.status >= 500:
                return Readiness(False, f"GET /v1/models answered HTTP {exc.status}", 0)
            return Readiness(True, f"GET /v1/models answered HTTP {exc.status}")
        return Readiness(True, "GET /v1/models answered HTTP 200")

    async def start_discovery(self) -> None:
        """A ``dns+http://`` upstream's first lookup (awaited: the engines are known when
        the proxy starts serving), then its refresh loop. A failed first lookup starts
        with no engine (503 ``no_engine_available``) and keeps asking."""
        if self.discovery is not None:
            await self.discovery.resolve_once()
            self.discovery.start()

    async def aclose(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self._session.close()


class ContextWindows:
    """The served models' context lengths, learned from the upstream and bounded by it.

    Only names the upstream lists (``Upstream.models()``, fetched again every
    ``TRIMPROXY_MODELS_REFRESH`` seconds) get a window of their own: vLLM's
    ``max_model_len`` from the listing, or FastChat's ``contextLength`` from
    ``/api/v1/token_check``, asked once per listed name. A name the upstream does not
    list gets the window of the one served model when there is exactly one (an
    alias, or a name the upstream will refuse itself), else none: then only
    ``TRIMPROXY_MAX_PROMPT_TOKENS`` bounds it, and the upstream answers it the way
    it answers any unknown model. So neither the memory kept here nor the calls made
    upstream grow with the names clients send.
    """

    def __init__(self, upstream: Upstream, retry_after: float = 10.0, ttl: float = 300.0) -> None:
        self._upstream = upstream
        # FastChat's per-model answers, for listed names only: (length, valid until).
        self._checked: dict[str, tuple[int | None, float]] = {}
        self._pending: dict[str, asyncio.Future[int | None]] = {}
        self._retry_after = retry_after
        self._ttl = ttl
        self._quiet_until = 0.0

    async def get(self, model: str) -> int | None:
        served = await self._upstream.models()
        entry = next((e for e in served if e.id == model), None)
        if entry is None and len(served) == 1:
            entry = served[0]
        if entry is None:
            self._warn(model if served else None)
            return None
        if entry.max_model_len is not None:
            return entry.max_model_len
        length = await self._token_check(entry.id, {e.id for e in served})
        if length is None:
            self._warn(entry.id)
        return length

    async def _token_check(self, name: str, listed: set[str]) -> int | None:
        now = time.monotonic()
        known = self._checked.get(name)
        if known is not None and known[1] > now:
            return known[0]
        pending = self._pending.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._pending[name] = future
        try:
            value = await self._upstream.token_check(name)
            for gone in [n for n in self._checked if n not in listed]:
                del self._checked[gone]  # no longer served: the upstream's list bounds this
            self._checked[name] = (value, now + (self._ttl if value else self._retry_after))
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            del self._pending[name]

    def _warn(self, model: str | None) -> None:
        """One warning a minute at most: the names come from clients."""
        now = time.monotonic()
        if now < self._quiet_until:
            return
        self._quiet_until = now + 60.0
        if model is None:
            log.warning(
                "the upstream listed no models (GET /v1/models failed or was empty); prompts "
                "are bounded only by TRIMPROXY_CONTEXT_WINDOW or TRIMPROXY_MAX_PROMPT_TOKENS"
            )
        else:
            log.warning(
                "could not learn the context window of model %r from the upstream; "
                "set TRIMPROXY_CONTEXT_WINDOW (or TRIMPROXY_MAX_PROMPT_TOKENS) to bound prompts",
                model[:100],
            )
