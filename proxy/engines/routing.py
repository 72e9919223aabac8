"""Which engine serves a request (``TRIMPROXY_ROUTING``): pure functions and the router.

``session`` (the default) is rendezvous (highest-random-weight) hashing: each engine
scores the session's key with a hash of both, and the engines in falling score are
the session's *rendezvous order*. Every proxy replica computes the same order with no
shared state, and when an engine leaves, only the sessions it led move (to their
second engine); everyone else's first engine is unchanged. So a conversation's turns
meet the prefix cache its earlier turns filled.

Bounded load keeps the hash from piling sessions onto one engine (nine sessions over
three engines: the hash alone may put most of them on one): the load is the sessions
each engine holds (``proxy.engines.holdings``), and an engine that would hold more
than ``(1 + eps) x`` the mean with this session is passed over for the session's next
engine in its order (consistent hashing with bounded loads, Mirrokni et al. 2018); when
none is under the bound, the one holding fewest takes it. A session keeps the engine
that holds it while that engine stays within the bound: moving it would cost its cached
prefix.

``least_loaded`` and ``round_robin`` ignore the session (engines without a prefix cache,
and comparisons).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, TypeVar

from proxy.engines.engine import Engine
from proxy.engines.holdings import Holdings

Policy = Literal["session", "least_loaded", "round_robin"]
T = TypeVar("T")


def score(key: str, engine: str) -> int:
    """The rendezvous weight of ``engine`` for ``key``: 64 bits of a keyed hash."""
    h = hashlib.blake2b(digest_size=8, person=b"trimproxy-hrw")
    name = engine.encode()
    h.update(len(name).to_bytes(4, "big"))  # length-prefixed: no ambiguous joins
    h.update(name)
    h.update(key.encode())
    return int.from_bytes(h.digest(), "big")


def rendezvous_order(key: str, names: Sequence[str]) -> list[int]:
    """Indexes of ``names`` from the highest weight for ``key`` to the lowest."""
    return sorted(range(len(names)), key=lambda i: (-score(key, names[i]), names[i]))


def bounded_choice(
    order: Sequence[int], loads: Sequence[float], load_factor: float, total: float | None = None
) -> int:
    """The first of ``order`` whose load with one more stays within ``(1 + load_factor) x``
    the mean load (that one counted); else the least loaded (the first in ``order``
    among equals). ``total``: the load to share out (default: ``sum(loads)``)."""
    total = (sum(loads) if total is None else total) + 1.0
    bound = (1.0 + load_factor) * total / len(loads)
    for i in order:
        if loads[i] + 1.0 <= bound:
            return i
    return min(order, key=lambda i: loads[i])


def least_loaded(loads: Sequence[float], start: int) -> int:
    """The least loaded index; ties go to the first from ``start`` on (rotating)."""
    n = len(loads)
    return min(range(n), key=lambda k: (loads[(start + k) % n], k)) + start


def session_order(
    key: str,
    engines: Sequence[T],
    names: Sequence[str],
    held: Sequence[float],
    load_factor: float,
    current: int | None = None,
    others: int | None = None,
) -> list[T]:
    """``engines`` in the order a session tries them: its bounded choice first, then
    the rest of its rendezvous order (the engine a failed request retries on).
    ``held``: the sessions each engine holds, this one counted at ``current`` (the
    index of the engine that holds it, tried first), if any. ``others``: the sessions
    held in all but this one, those of engines gone too (they come to these engines
    next; default: those of ``held``)."""
    order = rendezvous_order(key, names)
    loads, candidates = list(held), order
    if current is not None:
        loads[current] -= 1
        candidates = [current, *(i for i in order if i != current)]
    first = bounded_choice(candidates, loads, load_factor, others)
    return [engines[first], *(engines[i] for i in order if i != first)]


class Router:
    """The policy over an engine list's live engines: the sessions' holdings and a
    round-robin counter."""

    def __init__(self, policy: Policy, load_factor: float, holdings: Holdings) -> None:
        self.policy = policy
        self.load_factor = load_factor
        self.holdings = holdings
        self._next = 0

    def order(self, live: Sequence[Engine], key: str | None) -> Sequence[Engine]:
        """The live engines in the order this request tries them (the first serves it)."""
        if len(live) <= 1:
            return live
        if self.policy == "session" and key is not None:
            names = [e.url for e in live]
            holder = self.holdings.engine_of(key)
            current = names.index(holder) if holder in names else None
            held = [self.holdings.held(name) for name in names]
            others = self.holdings.sessions() - (holder is not None)
            chosen = session_order(key, live, names, held, self.load_factor, current, others)
            self.holdings.hold(key, chosen[0].url)
            return chosen
        start = self._next % len(live)
        self._next += 1
        if self.policy == "least_loaded":
            start = least_loaded([e.load() for e in live], start) % len(live)
        return [*live[start:], *live[:start]]

    def retried(self, key: str | None, engine: Engine) -> None:
        """The request of ``key`` went to ``engine`` after its first engine failed to
        connect: ``engine`` holds the session now (not the one that failed)."""
        if self.policy == "session" and key is not None:
            self.holdings.hold(key, engine.url)
