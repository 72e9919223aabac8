"""What each engine needs besides its URL, built with it and stopped with the app.

For every engine of every upstream (the top level's and the models file's), built by
the factory the upstream is given (``Fleet.factory``, so an engine has its hooks from
the start, also one that joins later through DNS): its ``engine`` label, request counter
and up gauge, and its KV gate (``TRIMPROXY_KV_ADMISSION``, or the model's
``kv_admission``: a ledger per engine, ``auto`` reading that engine's own capacity),
kept in ``gates``. Once the upstreams are built (``start``): each engine's ``/metrics``
scraper, and for every upstream of several engines the health prober. Engines that
leave have theirs stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence

from proxy.admission import KvAdmission, build_admission
from proxy.engines.engine import Engine
from proxy.engines.pool import EngineFactory
from proxy.engines.urls import engine_label
from proxy.metrics import Metrics
from proxy.models import ModelRoutes
from proxy.scrape import UpstreamScraper, build_scraper
from proxy.settings import Settings
from proxy.upstream.client import Upstream
from proxy.upstream.probe import Prober

log = logging.getLogger("trimproxy.engines")

#: Each engine's KV gate, by engine (the same object the upstream routes to).
Gates = dict[Engine, KvAdmission]


class Fleet:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.gates: Gates = {}
        """Every engine's KV gate where admission is on (handed to ``Services``)."""
        self._upstreams: list[tuple[Upstream, Settings]] = []
        self._aggregate: Upstream | None = None
        self._scrapers: dict[Engine, UpstreamScraper] = {}
        self._probers: list[Prober] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def factory(self, settings: Settings) -> EngineFactory:
        """Builds the engines of an upstream configured by ``settings``, hooks and all."""

        def build(url: str) -> Engine:
            m = self._metrics
            label = engine_label(url)
            metric_label = m.engine_label(label)
            up = m.engine_up.labels(metric_label)
            gate = build_admission(settings, m, url, metric_label)
            engine = Engine(
                url,
                label,
                on_request=m.engine_requests.labels(metric_label).inc,
                on_state=lambda state: up.set(1 if state else 0),
                reserved=gate.ledger.local_reserved if gate is not None else None,
            )
            if gate is not None:
                self.gates[engine] = gate
            engine.state_known()
            return engine

        return build

    def start(self, table: ModelRoutes) -> None:
        """Scrape every engine of ``table``'s upstreams, each with the settings of the
        first route that uses it (the top level first); probe those of several."""
        seen: dict[int, tuple[Upstream, Settings]] = {}
        for route in (table.default, *table.by_name.values()):
            seen.setdefault(id(route.upstream), (route.upstream, route.settings))
        self._upstreams = list(seen.values())
        self._aggregate = table.default.upstream
        for upstream, settings in self._upstreams:
            for engine in upstream.engines.all():
                self._attach(upstream, settings, engine)
            upstream.engines.subscribe(self._listener(upstream, settings))
            if upstream.lone is None:  # a lone engine comes back by the calls that reach it
                prober = Prober(upstream, settings.ready_timeout)
                prober.start()
                self._probers.append(prober)

    def _listener(
        self, upstream: Upstream, settings: Settings
    ) -> Callable[[Sequence[Engine], Sequence[Engine]], None]:
        def changed(added: Sequence[Engine], removed: Sequence[Engine]) -> None:
            for engine in added:
                self._attach(upstream, settings, engine)
            for engine in removed:
                self._spawn(self._detach(engine))

        return changed

    def _attach(self, upstream: Upstream, settings: Settings, engine: Engine) -> None:
        gate = self.gates.get(engine)
        scraper = build_scraper(
            settings,
            upstream,
            self._metrics,
            gate.observe_engine if gate is not None else None,
            engine=engine,
            aggregate=upstream is self._aggregate,
        )
        if scraper is not None:
            scraper.start()
            self._scrapers[engine] = scraper

    async def _detach(self, engine: Engine) -> None:
        scraper = self._scrapers.pop(engine, None)
        if scraper is not None:
            await scraper.stop()
        gate = self.gates.pop(engine, None)
        if gate is not None:
            await gate.aclose()

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for prober in self._probers:
            await prober.stop()
        for scraper in self._scrapers.values():
            await scraper.stop()
        self._scrapers.clear()
        for task in list(self._tasks):
            await task
        for gate in self.gates.values():
            await gate.aclose()
        self.gates.clear()
