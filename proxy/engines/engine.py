"""One engine: a base URL, its health, what it holds for this process, its ledger.

An ``Engine`` is built once per URL by the engine list (``proxy.engines.pool``), with
its hooks (the factory of ``proxy.fleet``), and shared by everything that talks to it:
``Upstream`` sends to ``engine.url`` on its one client, the scraper keeps
``engine.stats``, the prober flips ``engine.health``. Its KV gate is the fleet's
(``Fleet.gates``): this layer sits under admission and knows only what the gate holds
(``reserved``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from yarl import URL

from proxy.engines.stats import EngineStats
from proxy.engines.urls import engine_label

#: The first re-probe of an engine that left the rotation; doubled up to the interval.
FIRST_RETRY = 0.5


@dataclass(slots=True)
class Health:
    """In or out of the rotation, and when to ask again (backoff while out)."""

    up: bool = True
    failures: int = 0
    """Failed probes or connections in a row."""
    next_probe: float = 0.0
    reason: str = ""
    """Why it is out: a bounded word (``connect``, ``timeout``, ``http_503``, ...)."""
    epoch: int = 0
    """Failures seen in all: a probe sent before the latest one is stale (``answered``)."""

    def failed(self, now: float, reason: str, interval: float) -> bool:
        """Out of the rotation; True when it was in until now."""
        was_up = self.up
        self.up = False
        self.reason = reason
        self.next_probe = now + min(FIRST_RETRY * 2 ** min(self.failures, 16), interval)
        self.failures += 1
        self.epoch += 1
        return was_up

    def answered(self, now: float, interval: float, asked_in: int | None = None) -> bool:
        """In the rotation; True when it was out until now. ``asked_in``: the ``epoch``
        the probe was sent in; an answer to a probe sent before a request found the
        engine down is stale (the engine may have died since) and changes nothing."""
        if asked_in is not None and asked_in != self.epoch:
            return False
        was_down = not self.up
        self.up = True
        self.failures = 0
        self.reason = ""
        self.next_probe = now + interval
        return was_down


# eq=False: an engine is itself, hashed by identity (the fleet keys its gates by it).
@dataclass(slots=True, eq=False)
class Engine:
    url: str
    label: str = ""
    """Its name in logs and metrics (``host:port``; ``other`` past the label cap)."""
    health: Health = field(default_factory=Health)
    in_flight: int = 0
    """Chat requests this process has forwarded to it and not yet seen end."""
    stats: EngineStats | None = None
    """The last good scrape of its ``/metrics`` (``proxy.scrape``), or None."""
    reserved: Callable[[], int] | None = None
    """KV tokens its ledger holds for this process (``TRIMPROXY_KV_ADMISSION``); None
    when admission is off."""
    on_request: Callable[[], None] | None = None
    """Counts one request sent to it (``trimproxy_engine_requests_total``)."""
    on_state: Callable[[bool], None] | None = None
    """Told ``up`` after each probe or failure (``trimproxy_engine_up``)."""
    urls: dict[str, URL] = field(default_factory=dict)
    """Prepared URLs of the routes that carry the traffic."""

    def __post_init__(self) -> None:
        if not self.label:
            self.label = engine_label(self.url)

    def load(self) -> int:
        """What it holds for this process now: reserved KV tokens with admission, else
        requests in flight (what ``least_loaded`` routing compares)."""
        if self.reserved is not None:
            return self.reserved()
        return self.in_flight

    def state_known(self) -> None:
        if self.on_state is not None:
            self.on_state(self.health.up)

    def sent(self) -> None:
        if self.on_request is not None:
            self.on_request()


def now() -> float:
    return time.monotonic()
