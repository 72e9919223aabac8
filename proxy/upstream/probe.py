"""The health probe: each engine's ``GET /v1/models``, and backoff for those out.

An engine in the rotation is probed every ``TRIMPROXY_HEALTH_INTERVAL`` seconds; one
that failed a probe, refused a connection or timed out on connect leaves the rotation
(``Transport.engine_failed``) and is probed again after 0.5 s, then 1 s, 2 s, ... up to
the interval, until it answers. A probe gets ``TRIMPROXY_READY_TIMEOUT`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from proxy.background import Background
from proxy.engines.engine import FIRST_RETRY, Engine
from proxy.upstream.client import Upstream
from proxy.upstream.readiness import engine_ready

log = logging.getLogger("trimproxy.engines")

Sleep = Callable[[float], Awaitable[None]]


class Prober:
    """Probes the engines of one upstream; started and stopped by the lifespan."""

    def __init__(
        self,
        upstream: Upstream,
        timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._upstream = upstream
        self._timeout = timeout
        self._clock = clock
        self._sleep = sleep
        self._background = Background("trimproxy-engine-prober", self._run, log)

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()

    async def _run(self) -> None:
        while True:
            try:
                await self.probe_due()
            except Exception:  # a bug here must not end the probing for good
                log.exception("probing the engines failed unexpectedly")
            await self._sleep(self._pause())

    def _pause(self) -> float:
        """Until the next probe is due; at most ``FIRST_RETRY`` so that an engine a
        request just found down is asked again on time."""
        engines = self._upstream.engines.all()
        soonest = min((e.health.next_probe for e in engines), default=self._clock() + 1.0)
        return max(0.05, min(soonest - self._clock(), FIRST_RETRY))

    async def probe_due(self) -> None:
        """Probe every engine whose time has come, all at once."""
        now = self._clock()
        due = [e for e in self._upstream.engines.all() if e.health.next_probe <= now]
        if due:
            await asyncio.gather(*(self.probe(e) for e in due))

    async def probe(self, engine: Engine) -> bool:
        """One probe of ``engine``; True when it answered."""
        asked_in = engine.health.epoch
        try:
            async with asyncio.timeout(self._timeout):
                readiness = await engine_ready(self._upstream, engine)
            ok, why = readiness.ready, readiness.detail
        except TimeoutError:
            ok, why = False, f"no answer within {self._timeout:g} s"
        if ok:
            self._upstream.transport.engine_answered(engine, asked_in)
        else:
            if engine.health.up:
                log.warning("engine %s failed its health probe: %s", engine.label, why)
            self._upstream.transport.engine_failed(engine, "probe")
        return ok
