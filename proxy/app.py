"""The app factory and its lifespan."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

import proxy
from proxy.chains.keeper import Keeper, build_keeper
from proxy.compaction.key import build_sealer
from proxy.dependencies import Services
from proxy.errors import ProxyError, envelope
from proxy.fleet import Fleet, Gates
from proxy.logs import setup_logging
from proxy.metrics import Metrics
from proxy.middleware import Accounting, ApiKeys, InFlightLimit
from proxy.models import ModelRoute, ModelRoutes, ModelsFileError, build_routes, load_models
from proxy.openapi import DESCRIPTION
from proxy.pipeline.breakoff import RelayAborted, quiet_relay_aborts
from proxy.pipeline.dialect import Dialect
from proxy.pipeline.handler import DirectRoute, error_response
from proxy.pipeline.table import Table, builtin_dialects
from proxy.routes import routes
from proxy.sessions.gate import Sessions, build_sessions
from proxy.settings import Settings
from proxy.tokens.errors import ConfigError
from proxy.types import JSON_MEDIA_TYPE

log = logging.getLogger("trimproxy")

# Allocations between collections of the youngest generation (CPython's default: 700).
_YOUNG_THRESHOLD = 10_000


def create_app(
    settings: Settings | None = None,
    metrics: Metrics | None = None,
    *,
    serving: bool = False,
    dialects: Iterable[Dialect] | None = None,
) -> FastAPI:
    """The proxy app, a ``FastAPI``: an operator adds routes, dependencies and
    middleware to it the FastAPI way. ``serving``: this process serves it and nothing
    else (``trimproxy serve``): once started, its heap is settled (``settle_heap``).
    ``dialects``: the prompt routes' wire formats (the dialect table, §22; by default
    chat, Responses, Messages and completions): their routes, the API keys' and the
    in-flight limit's paths, the metrics' route labels and the error envelopes all
    follow from it."""
    settings = settings if settings is not None else Settings()
    metrics = metrics if metrics is not None else Metrics()
    table = Table(builtin_dialects() if dialects is None else dialects)
    app = FastAPI(
        title="trimproxy",
        version=proxy.__version__,
        description=DESCRIPTION,
        lifespan=_lifespan(settings, metrics, serving),
        # FastAPI's own OpenTelemetry off: the proxy's metrics and access log cover
        # every request, and asking for OpenTelemetry's providers on each one is a
        # cost on every request (docs/performance.md §6).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    refused_in_one_line(app)
    app.state.dialects = table
    app.router.routes.extend([*table.routes, *routes()])
    app.add_exception_handler(ProxyError, _proxy_error)
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
    quiet_relay_aborts()
    # Added innermost first: Accounting sees every answer, the 401s and 429s too.
    # A DirectRoute per prompt route, innermost, serves it ahead of FastAPI's exception
    # middleware, router and dependency solving; the first row's (chat's) outermost, so
    # chat passes no other. Middleware an operator adds later is outside them all and
    # sees every prompt request (docs/fastapi.md).
    for dialect in reversed(table.dialects):
        app.add_middleware(DirectRoute, dialect=dialect)
    if settings.max_in_flight:
        app.add_middleware(InFlightLimit, limit=settings.max_in_flight, table=table)
    if settings.api_key_set:
        app.add_middleware(ApiKeys, keys=settings.api_key_set, table=table)
    app.add_middleware(Accounting, metrics=metrics, table=table)
    return app


def _lifespan(
    settings: Settings, metrics: Metrics, serving: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: everything stateful built once on ``app.state.services``,
    closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        fleet = Fleet(metrics)
        try:
            table, sessions = await _build(settings, metrics, fleet)
        except (ConfigError, ModelsFileError) as exc:
            app.state.refused = str(exc)  # one line: refused_in_one_line
            raise
        for upstream in table.upstreams:
            await upstream.start_discovery()  # dns+http:// upstreams: their engines now
        # Each engine's scraper; each upstream's health prober.
        fleet.start(table)
        keeper = build_keeper(settings, metrics)
        await keeper.start()
        app.state.sealer = await build_sealer(settings)  # compaction items (§24)
        app.state.services = _services(settings, metrics, table, sessions, fleet.gates, keeper)
        counter = table.default.counter
        log.info("trimproxy ready: upstream %s, tokenizer %s", settings.upstream_url, counter.name)
        if serving:
            settle_heap()
        try:
            yield
        finally:
            await fleet.aclose()
            if sessions is not None:
                await sessions.aclose()
            await keeper.aclose()
            metrics.close()
            await table.aclose()

    return lifespan


async def _build(
    settings: Settings, metrics: Metrics, fleet: Fleet
) -> tuple[ModelRoutes, Sessions | None]:
    """The route table and the session gate; what was built is closed on a failure.

    One upstream per distinct URL, one counter per (tokenizer, upstream): the top
    level's, and those of the models file (proxy.models); each engine built with its
    labels and KV gate (proxy.fleet).
    """

    def count_upstream_error(kind: str) -> None:
        metrics.upstream_errors.labels(kind).inc()

    def count_retry(reason: str) -> None:
        metrics.upstream_retries.labels(reason).inc()

    def count_fallback(reason: str) -> None:
        metrics.token_count_fallbacks.labels(reason).inc()

    try:
        models = load_models(settings)
        table = await build_routes(
            settings,
            models,
            count_upstream_error,
            fleet.factory,
            on_retry=count_retry,
            on_fallback=count_fallback,
        )
    except BaseException:
        await fleet.aclose()
        raise
    try:
        sessions = build_sessions(settings, metrics)  # None: no session limit is set
        if sessions is not None:
            await sessions.start()
    except BaseException:
        await fleet.aclose()
        await table.aclose()
        raise
    return table, sessions


def refused_in_one_line(app: FastAPI) -> None:
    """A setting that the lifespan finds unusable though the start-up checks passed
    it (a tokenizer that fails only once loaded, an upstream that refuses ``/tokenize``
    only now) ends start-up with its one line, ``app.state.refused``: the server logs
    what the lifespan's failure says, which Starlette makes the whole traceback.
    ``trimproxy serve`` then exits 2 with that line, as for any bad setting."""
    lifespan = app.router.lifespan

    async def one_line(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            refused = getattr(app.state, "refused", None)
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": refused}
            await send(message)

        await lifespan(scope, receive, sending)

    app.router.lifespan = one_line  # type: ignore[method-assign]


def settle_heap() -> None:
    """Take what start-up built out of the collector's reach, and collect less often.

    A proxy serving a few thousand requests a second leaves some cyclic garbage on each
    (asyncio's futures and callbacks, exceptions with their tracebacks), so the
    collector runs all the time, and every full collection walks the whole heap: the
    modules, the tokenizer and the app, tens of thousands of objects that can never be
    garbage. Frozen, they are never walked again, and a full collection no longer
    sets a busy proxy's p99 (docs/performance.md §6). The first generation's threshold
    goes from CPython's default to ``_YOUNG_THRESHOLD`` allocations: fewer of the objects
    a request holds while it is in flight live long enough to be moved on and walked
    again, for a little more memory.
    For the serving process only: a process that builds many apps (the test suite)
    would keep each one's garbage for good.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_THRESHOLD, older, oldest)


def _services(
    settings: Settings,
    metrics: Metrics,
    table: ModelRoutes,
    sessions: Sessions | None,
    gates: Gates,
    keeper: Keeper | None = None,
) -> Services:
    """The top level's services, with each named model's own beside them."""
    default = table.default

    def view(route: ModelRoute) -> Services:
        return Services(
            settings=route.settings,
            metrics=metrics,
            upstream=route.upstream,
            windows=route.windows,
            counter=route.counter,
            sessions=sessions,
            gates=gates,
            keeper=keeper,
            model_label=route.name,
        )

    top = view(default)
    top.by_model = {name: view(route) for name, route in table.by_name.items()}
    if len(table.upstreams) > 1 or len(default.upstream.engines.all()) > 1:
        top.upstreams = table.upstreams  # /v1/models: the union of every engine's list
    return top


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` in multi-worker mode: settings from the env.

    Each worker is a fresh interpreter, so it sets up its own (JSON) logging here.
    """
    settings = Settings()
    setup_logging(settings.log_level)
    return create_app(settings, serving=True)


def _table(request: Request) -> Table:
    table: Table = request.app.state.dialects
    return table


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)  # registered for ProxyError only
    return error_response(request, exc, _table(request).envelope_for(request.scope["path"]))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    path = request.url.path
    if exc.status_code == 404:
        message, code = (
            f"No route {path}. The proxy serves /v1/* and /tokenize, "
            "and /healthz, /readyz, /metrics; /docs lists its routes.",
            "not_found",
        )
    elif exc.status_code == 405:
        message, code = f"{request.method} is not allowed on {path}.", "method_not_allowed"
    else:
        message, code = str(exc.detail), "http_error"
    # In the envelope of the path's dialect (an Anthropic client reads Anthropic's).
    body = _table(request).envelope_for(path).plain(exc.status_code, message, code)
    return Response(
        body, status_code=exc.status_code, media_type=JSON_MEDIA_TYPE, headers=exc.headers
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    if isinstance(exc, RelayAborted):  # the relay logged it; nothing can be answered
        return Response(status_code=502)
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = envelope(
        "The proxy failed on this request. It was logged; retry, and report it if it persists.",
        "server_error",
        "internal_error",
    )
    return Response(body, status_code=500, media_type=JSON_MEDIA_TYPE)
