"""``Upstream``: the client of one upstream setting and its engines.

As httpx's ``Client`` over its transport: ``Upstream`` knows the engines (one URL, a
list, or a ``dns+http://`` name: ``proxy.engines``), the order a request tries them in
(``TRIMPROXY_ROUTING``), and the engine's API the proxy itself calls (``/v1/models``,
``/tokenize``, FastChat's token check, ``/metrics``, readiness); ``Transport`` sends
each request on the one session. Relaying the answer back is ``proxy.pipeline.relay``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from proxy.engines.discovery import Discovery, DnsResolver, parse_dns_url
from proxy.engines.engine import Engine
from proxy.engines.holdings import MemoryHoldings
from proxy.engines.pool import EngineFactory, EngineList, StaticEngines
from proxy.engines.routing import Router
from proxy.engines.served import ServedModel, merge_served
from proxy.errors import NoEngineAvailable, no_engine_available
from proxy.settings import Settings
from proxy.upstream.calls import (
    Tokenized,
    UpstreamCallFailed,
    call_unreached,
    parse_models,
    unanswered,
)
from proxy.upstream.failover import failover
from proxy.upstream.flight import Flight
from proxy.upstream.transport import ErrorHook, Transport

log = logging.getLogger("trimproxy.upstream")


class Upstream:
    """The shared client of one upstream setting and its engines (one or several:
    ``proxy.engines``); built once in the lifespan, closed with it."""

    def __init__(
        self,
        settings: Settings,
        *,
        engines: EngineList | None = None,
        on_error: ErrorHook | None = None,
        on_retry: ErrorHook | None = None,
        engine_factory: EngineFactory = Engine,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_error``: counts the failures of forwarded requests
        (``trimproxy_upstream_errors_total{kind}``); ``on_retry``: counts the requests
        sent once more on a fresh connection (``trimproxy_upstream_retries_total``);
        ``engine_factory``: builds each
        engine with its hooks (``proxy.fleet``); ``clock``: when the cached list of
        served models and its backoff run out (tests)."""
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
            urls = [] if name else settings.upstream_url.split(",")
            engines = StaticEngines(urls, engine_factory)
            if name is None and len(engines.all()) == 1:
                self.lone = engines.all()[0]
        self.engines: EngineList = engines
        if name is not None:
            resolver = DnsResolver(settings.dns_nameserver)
            self.discovery = Discovery(name, resolver, settings.upstream_refresh, engines.replace)
        holdings = MemoryHoldings(settings.routing_session_idle, settings.session_max_entries)
        self.router = Router(settings.routing, settings.routing_load_factor, holdings)
        self.health_interval = settings.health_interval
        self.transport = Transport(settings, on_error=on_error, lone=self.lone, on_retry=on_retry)
        self._said: set[tuple[str, str]] = set()
        self._models_ttl = settings.models_refresh
        self._models_retry = settings.models_retry
        self._models_failures = 0
        self._models: Flight[None, tuple[ServedModel, ...]] = Flight(self._models_keep, clock)

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
            raise no_engine_available(len(every), self.base_url, self.health_interval)
        return self.router.order(live, key)

    async def forward(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        client_gone: asyncio.Future[None] | None = None,
        engine: Engine | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request to ``engine``, else to the rotation's first (the next one when
        nothing reached it: ``failover``); return once the response head has arrived."""
        send = self.transport.send
        if engine is not None:
            return await send(engine, method, path, headers, body, client_gone)

        async def attempt(e: Engine) -> aiohttp.ClientResponse:
            return await send(e, method, path, headers, body, client_gone)

        response, _ = await failover(self.order(), attempt, unanswered)
        return response

    # -- the proxy's own calls ----------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        max_bytes: int = 16 << 20,
        timeout: aiohttp.ClientTimeout | None = None,
        engine: Engine | None = None,
    ) -> bytes:
        """One small request (``Transport.call``) to ``engine``, else to any live one:
        the next is asked when the first cannot be reached."""
        if engine is not None:
            return await self.transport.call(
                engine, method, path, payload, max_bytes=max_bytes, timeout=timeout
            )
        try:
            order = self.order()
        except NoEngineAvailable:
            raise UpstreamCallFailed(path, None, "no_engine") from None

        async def attempt(e: Engine) -> bytes:
            return await self.transport.call(
                e, method, path, payload, max_bytes=max_bytes, timeout=timeout
            )

        body, _ = await failover(order, attempt, call_unreached)
        return body

    async def call_json(
        self, method: str, path: str, payload: Any = None, engine: Engine | None = None
    ) -> Any:
        raw = await self.call(method, path, payload, engine=engine)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamCallFailed(path, 200, "unparsable") from exc

    def _models_keep(self, found: tuple[ServedModel, ...]) -> float:
        """How long a model list keeps: ``TRIMPROXY_MODELS_REFRESH``; an empty one (the
        upstream could not be asked) ``TRIMPROXY_MODELS_RETRY``, twice that, ... up to
        the refresh, so a restarting upstream is neither hammered nor forgotten."""
        if found:
            self._models_failures = 0
            return self._models_ttl
        ttl: float = min(
            self._models_ttl, self._models_retry * 2.0 ** min(self._models_failures, 16)
        )
        self._models_failures += 1
        return ttl

    async def models(self) -> tuple[ServedModel, ...]:
        """The served models, from ``GET /v1/models``; cached, one request at a time."""
        # Every request asks: the fresh list is read without a coroutine of Flight's
        # (docs/performance.md §6).
        known = self._models.fresh(None)
        if known is not None:
            return known
        return await self._models.get(None, self._served)

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
            return parse_models(await self.call_json("GET", "/v1/models", engine=engine))
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
        return Tokenized.read(await self.call_json("POST", "/tokenize", body))

    async def tokenize_prompt(
        self, prompt: str, model: str | None, *, add_special_tokens: bool = True
    ) -> Tokenized:
        """vLLM's ``POST /tokenize`` in its completion form: a raw prompt, encoded as
        ``/v1/completions`` encodes it (special tokens added unless told not to)."""
        body: dict[str, Any] = {"prompt": prompt, "add_special_tokens": add_special_tokens}
        if model is not None:
            body["model"] = model
        return Tokenized.read(await self.call_json("POST", "/tokenize", body))

    async def token_check(self, model: str) -> int | None:
        """FastChat's context length (``POST /api/v1/token_check``); None if not told."""
        payload = {"prompts": [{"model": model, "prompt": "", "max_tokens": 0}]}
        try:
            checked = await self.call_json("POST", "/api/v1/token_check", payload)
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
            t = self.transport
            bound = aiohttp.ClientTimeout(
                total=timeout, connect=t.connect_timeout, sock_read=t.read_timeout
            )
        engine = engine or self.engines.all()[0]
        raw = await self.call("GET", "/metrics", max_bytes=max_bytes, timeout=bound, engine=engine)
        return raw.decode("utf-8", errors="replace")

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
        await self.transport.aclose()
