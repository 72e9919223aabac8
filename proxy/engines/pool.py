"""The engines of one upstream setting: a Protocol, and the static list.

``EngineList`` is what routing, the prober, the scraper and admission read: every
engine known, and the live ones (in the rotation). ``replace(urls)`` swaps the set,
keeping the ``Engine`` (health, ledger, counters) of every URL that stays: a DNS
resolver calls it on each refresh, and listeners (``subscribe``) start and stop what
each engine needs (its scraper, its ledger).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from proxy.engines.engine import Engine

log = logging.getLogger("trimproxy.engines")

#: Told the engines that joined and those that left, after each change of the set.
Listener = Callable[[Sequence[Engine], Sequence[Engine]], None]
EngineFactory = Callable[[str], Engine]


class EngineList(Protocol):
    def all(self) -> Sequence[Engine]:
        """Every engine, in the order configured (or resolved)."""
        ...

    def live(self) -> Sequence[Engine]:
        """The engines in the rotation, in the same order."""
        ...

    def replace(self, urls: Sequence[str]) -> None:
        """Make ``urls`` the set; engines that stay keep their state."""
        ...

    def subscribe(self, listener: Listener) -> None: ...


class StaticEngines:
    """The engines of a URL or a comma-separated list: fixed unless ``replace``d."""

    def __init__(self, urls: Sequence[str], factory: EngineFactory = Engine) -> None:
        self._factory = factory
        self._engines: tuple[Engine, ...] = tuple(factory(u) for u in urls)
        self._listeners: list[Listener] = []

    def all(self) -> Sequence[Engine]:
        return self._engines

    def live(self) -> Sequence[Engine]:
        engines = self._engines
        # The common case (all up) hands out the tuple itself, with no copy.
        for engine in engines:
            if not engine.health.up:
                return tuple(e for e in engines if e.health.up)
        return engines

    def replace(self, urls: Sequence[str]) -> None:
        known = {e.url: e for e in self._engines}
        engines = tuple(known.get(u) or self._factory(u) for u in dict.fromkeys(urls))
        added = [e for e in engines if e.url not in known]
        kept = {e.url for e in engines}
        removed = [e for e in self._engines if e.url not in kept]
        self._engines = engines
        if added or removed:
            log.info(
                "engines: %d (joined: %s; left: %s)",
                len(engines),
                ", ".join(e.label for e in added) or "none",
                ", ".join(e.label for e in removed) or "none",
            )
            for listener in self._listeners:
                listener(added, removed)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)
