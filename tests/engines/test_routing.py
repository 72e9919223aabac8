"""Routing as pure functions: rendezvous order, bounded load, the sessions' holdings,
the router's policies."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from proxy.engines.engine import Engine
from proxy.engines.holdings import MemoryHoldings
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


@given(
    keys,
    st.lists(st.integers(min_value=0, max_value=20), min_size=3, max_size=3),
    st.sampled_from([None, 0, 1, 2]),
)
def test_session_order_puts_the_bounded_choice_first_then_the_rendezvous_order(
    key: str, held: list[int], current: int | None
) -> None:
    names = ENGINES[:3]
    if current is not None:
        held[current] += 1  # the session itself, where it is held
    chosen = session_order(key, [0, 1, 2], names, [float(h) for h in held], 0.25, current)
    order = rendezvous_order(key, names)
    assert chosen[1:] == [i for i in order if i != chosen[0]]
    others = list(held)
    if current is not None:
        others[current] -= 1
    bound = 1.25 * (sum(others) + 1) / 3
    if current is not None and others[current] + 1 <= bound:
        assert chosen[0] == current  # kept where it is held while within the bound
    elif others[chosen[0]] + 1 > bound:
        assert others[chosen[0]] == min(others)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def router(factor: float = 0.25, idle: float = 300.0, clock: Clock | None = None) -> Router:
    return Router("session", factor, MemoryHoldings(idle, clock=clock or Clock()))


def first_engines(r: Router, engines: list[Engine], keys: list[str]) -> dict[str, str]:
    return {key: r.order(engines, key)[0].url for key in keys}


def test_thirty_sessions_over_three_engines_stay_within_the_bound() -> None:
    """Each session is one unit of load where it is held: no engine ends above
    (1 + eps) x its share, although the hash alone puts more on one of them."""
    factor, engines = 0.1, [Engine(url) for url in ENGINES[:3]]
    keys = [f"s{i}" for i in range(30)]
    by_hash = Counter(rendezvous_order(key, ENGINES[:3])[0] for key in keys)
    assert max(by_hash.values()) > (1 + factor) * 10, by_hash  # the bound has work to do
    r = router(factor)
    held = Counter(first_engines(r, engines, keys).values())
    assert sum(held.values()) == 30
    assert max(held.values()) <= (1 + factor) * 10, held
    assert [r.holdings.held(e.url) for e in engines] == [held[e.url] for e in engines]


def test_sessions_whose_requests_never_overlap_are_spread_and_keep_their_engine() -> None:
    """No request is ever in flight beside another (users think between turns): what
    each engine holds is its sessions, so the spread is the same as when they overlap,
    and every later turn of a session goes where its first did."""
    engines = [Engine(url) for url in ENGINES[:3]]
    keys = [f"conversation-{i}" for i in range(9)]
    by_hash = Counter(rendezvous_order(key, ENGINES[:3])[0] for key in keys)
    assert sorted(by_hash.values()) == [1, 1, 7]  # what the hash alone would do
    r = router(0.25)
    first = first_engines(r, engines, keys)
    assert sorted(Counter(first.values()).values()) == [3, 3, 3]
    for _turn in range(5):
        assert first_engines(r, engines, keys) == first
    assert all(e.in_flight == 0 for e in engines)


def test_a_session_keeps_the_engine_that_holds_it_within_the_bound() -> None:
    engines = [Engine(url) for url in ENGINES[:3]]
    r = router(0.25)
    key = "moved"
    hashed = rendezvous_order(key, ENGINES[:3])
    second = engines[hashed[1]].url
    r.holdings.hold(key, second)  # held by its second engine (say, after a failover)
    assert r.order(engines, key)[0].url == second
    # The retry order after it is the rest of its rendezvous order.
    assert [e.url for e in r.order(engines, key)[1:]] == [
        ENGINES[i] for i in hashed if ENGINES[i] != second
    ]


def test_a_session_over_the_bound_moves_to_its_next_engine() -> None:
    engines = [Engine(url) for url in ENGINES[:3]]
    r = router(0.0)
    for i in range(4):  # four sessions held on engine 0, none elsewhere
        r.holdings.hold(f"crowd-{i}", engines[0].url)
    chosen = r.order(engines, "crowd-0")[0]
    assert chosen is not engines[0]
    assert r.holdings.engine_of("crowd-0") == chosen.url
    assert r.holdings.held(engines[0].url) == 3


def test_an_engine_that_leaves_moves_only_the_sessions_it_held() -> None:
    engines = [Engine(url) for url in ENGINES[:3]]
    keys = [f"s{i}" for i in range(12)]
    r = router(0.25)
    before = first_engines(r, engines, keys)
    gone = engines[0]
    after = first_engines(r, engines[1:], keys)
    for key in keys:
        if before[key] != gone.url:
            assert after[key] == before[key]
        else:
            assert after[key] != gone.url
    assert max(Counter(after.values()).values()) <= 1.25 * 12 / 2


def test_an_idle_session_is_no_longer_held() -> None:
    clock = Clock()
    holdings = MemoryHoldings(idle=60.0, clock=clock)
    holdings.hold("a", "e1")
    clock.now = 30.0
    holdings.hold("b", "e1")
    assert (holdings.held("e1"), holdings.engine_of("a")) == (2, "e1")
    clock.now = 61.0  # a idle 61 s, b 31 s
    assert (holdings.engine_of("a"), holdings.held("e1"), holdings.sessions()) == (None, 1, 1)
    holdings.hold("b", "e2")  # b's next request went to e2: e1 holds nothing
    assert (holdings.held("e1"), holdings.held("e2")) == (0, 1)
    clock.now = 200.0
    assert (holdings.held("e2"), holdings.sessions()) == (0, 0)


def test_holdings_are_bounded_in_number() -> None:
    holdings = MemoryHoldings(idle=60.0, limit=3, clock=Clock())
    for key in "abcd":
        holdings.hold(key, "e1")
    holdings.hold("b", "e1")  # used again: the least recently used is now c
    holdings.hold("e", "e2")
    assert [holdings.engine_of(k) for k in "abcde"] == [None, "e1", None, "e1", "e2"]
    assert (holdings.held("e1"), holdings.held("e2")) == (2, 1)


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(ENGINES[:3])), max_size=40),
    st.integers(min_value=1, max_value=8),
)
def test_held_counts_agree_with_where_each_session_is(
    steps: list[tuple[str, str]], limit: int
) -> None:
    holdings = MemoryHoldings(idle=60.0, limit=limit, clock=Clock())
    for key, engine in steps:
        holdings.hold(key, engine)
    where = [holdings.engine_of(k) for k in "abcdefgh"]
    assert holdings.sessions() == sum(w is not None for w in where) <= limit
    for engine in ENGINES[:3]:
        assert holdings.held(engine) == where.count(engine)


def test_the_router_policies() -> None:
    engines = [Engine(url) for url in ENGINES[:3]]
    holdings = MemoryHoldings(300.0)
    assert Router("round_robin", 0.25, holdings).order(engines[:1], "k") == engines[:1]
    rr = Router("round_robin", 0.25, holdings)
    firsts = [rr.order(engines, "same")[0].url for _ in range(6)]
    assert firsts == [e.url for e in engines] * 2
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 3, 0, 2
    assert Router("least_loaded", 0.25, holdings).order(engines, None)[0] is engines[1]
    assert holdings.sessions() == 0  # only session routing holds sessions
    session = Router("session", 0.25, holdings)
    engines[0].in_flight = engines[1].in_flight = engines[2].in_flight = 0
    chosen = session.order(engines, "conversation-7")
    assert [e.url for e in chosen] == [e.url for e in session.order(engines, "conversation-7")]
    assert sorted(e.url for e in chosen) == sorted(e.url for e in engines)
    assert holdings.engine_of("conversation-7") == chosen[0].url
