"""Routing as pure functions: rendezvous order, bounded load, the router's policies."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from proxy.engines.engine import Engine
from proxy.engines.routing import Router, bounded_choice, rendezvous_order, session_order

ENGINES = [f"http://10.0.0.{i}:8000" for i in range(1, 6)]
keys = st.text(min_size=1, max_size=40)


@given(keys)
def test_the_order_is_a_permutation_and_the_same_everywhere(key: str) -> None:
    order = rendezvous_order(key, ENGINES)
    assert sorted(order) == list(range(len(ENGINES)))
    # Another replica, with the engines listed in another order, picks the same engine.
    shuffled = list(reversed(ENGINES))
    again = rendezvous_order(key, shuffled)
    assert [shuffled[i] for i in again] == [ENGINES[i] for i in order]


@given(keys, st.integers(min_value=0, max_value=len(ENGINES) - 1))
def test_an_engine_that_leaves_moves_only_its_own_sessions(key: str, gone: int) -> None:
    first = ENGINES[rendezvous_order(key, ENGINES)[0]]
    rest = [e for i, e in enumerate(ENGINES) if i != gone]
    now = rest[rendezvous_order(key, rest)[0]]
    if first != ENGINES[gone]:
        assert now == first  # not its engine that left: it stays where it was
    else:
        assert now == ENGINES[rendezvous_order(key, ENGINES)[1]]  # its second engine


def test_sessions_spread_over_the_engines() -> None:
    firsts = Counter(rendezvous_order(f"session-{i}", ENGINES[:3])[0] for i in range(3000))
    assert set(firsts) == {0, 1, 2}
    assert all(800 <= n <= 1200 for n in firsts.values()), firsts


@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=2, max_size=6),
    st.floats(min_value=0.0, max_value=2.0),
)
def test_bounded_choice_respects_the_bound_or_takes_the_least_loaded(
    loads: list[int], factor: float
) -> None:
    order = list(range(len(loads)))
    chosen = bounded_choice(order, [float(x) for x in loads], factor)
    bound = (1 + factor) * (sum(loads) + 1) / len(loads)
    if loads[chosen] + 1 > bound:
        assert loads[chosen] == min(loads)
    # Every engine passed over was over the bound.
    for i in order[: order.index(chosen)]:
        assert loads[i] + 1 > bound


def test_thirty_sessions_over_three_engines_stay_within_the_bound() -> None:
    """Each session adds one unit of load where it is routed: no engine ends above
    (1 + eps) x its share, although the hash alone would put more on some."""
    factor = 0.25
    loads = [0.0, 0.0, 0.0]
    names = ENGINES[:3]
    for i in range(30):
        chosen = session_order(f"s{i}", [0, 1, 2], names, loads, factor)[0]
        loads[chosen] += 1
    assert sum(loads) == 30
    assert max(loads) <= (1 + factor) * 10


def test_the_router_policies() -> None:
    engines = [Engine(url) for url in ENGINES[:3]]
    assert Router("round_robin", 0.25).order(engines[:1], "k") == engines[:1]
    rr = Router("round_robin", 0.25)
    firsts = [rr.order(engines, "same")[0].url for _ in range(6)]
    assert firsts == [e.url for e in engines] * 2
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 3, 0, 2
    assert Router("least_loaded", 0.25).order(engines, None)[0] is engines[1]
    session = Router("session", 0.25)
    engines[0].in_flight = engines[1].in_flight = engines[2].in_flight = 0
    chosen = session.order(engines, "conversation-7")
    assert [e.url for e in chosen] == [e.url for e in session.order(engines, "conversation-7")]
    assert sorted(e.url for e in chosen) == sorted(e.url for e in engines)
