"""What each engine needs besides its URL, built and stopped with the app.

For every engine of every upstream (the top level's and the models file's): its
``engine`` label, request counter and up gauge; its KV ledger (``TRIMPROXY_KV_ADMISSION``,
or the model's ``kv_admission``: a ledger per engine, ``auto`` reading that engine's own
capacity); its ``/metrics`` scraper. For every upstream of several engines: the health
prober. Engines that join later (``EngineList.replace``) get the same; those that leave
have theirs stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence

from proxy.admission import build_admission
from proxy.engines.engine import Engine
from proxy.engines.health import Prober
from proxy.metrics import Metrics
from proxy.models import ModelRoutes
from proxy.scrape import UpstreamScraper, build_scraper
from proxy.settings import Settings
from proxy.upstream import Upstream

log = logging.getLogger("trimproxy.engines")


class Fleet:
    def __init__(
        self, metrics: Metrics, upstreams: Sequence[tuple[Upstream, Settings]], aggregate: Upstream
    ) -> None:
        """``upstreams``: each distinct upstream with the settings of the first route
        that uses it; ``aggregate``: the upstream whose engines the unlabelled
        ``trimproxy_upstream_*`` gauges sum up (the top level's)."""
        self._metrics = metrics
        self._upstreams = upstreams
        self._aggregate = aggregate
        self._scrapers: dict[int, UpstreamScraper] = {}
        self._probers: list[Prober] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def upstreams(self) -> list[Upstream]:
        return [upstream for upstream, _ in self._upstreams]

    def start(self) -> None:
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
        m = self._metrics
        label = m.engine_label(engine.label)
        engine.on_request = m.engine_requests.labels(label).inc
        up = m.engine_up.labels(label)
        engine.on_state = lambda state: up.set(1 if state else 0)
        engine.state_known()
        engine.admission = build_admission(settings, m, engine.url, label)
        on_cache = engine.admission.observe_engine if engine.admission is not None else None
        scraper = build_scraper(
            settings,
            upstream,
            m,
            on_cache,
            engine=engine,
            aggregate=upstream is self._aggregate,
        )
        if scraper is not None:
            scraper.start()
            self._scrapers[id(engine)] = scraper

    async def _detach(self, engine: Engine) -> None:
        scraper = self._scrapers.pop(id(engine), None)
        if scraper is not None:
            await scraper.stop()
        if engine.admission is not None:
            await engine.admission.aclose()

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
        for upstream, _ in self._upstreams:
            for engine in upstream.engines.all():
                if engine.admission is not None:
                    await engine.admission.aclose()


def build_fleet(metrics: Metrics, table: ModelRoutes) -> Fleet:
    """The fleet of every distinct upstream of ``table``, each with the settings of the
    first route that uses it (the top level first)."""
    seen: dict[int, tuple[Upstream, Settings]] = {}
    for route in (table.default, *table.by_name.values()):
        seen.setdefault(id(route.upstream), (route.upstream, route.settings))
    return Fleet(metrics, list(seen.values()), table.default.upstream)
