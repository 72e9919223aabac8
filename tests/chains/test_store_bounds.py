"""The response store's chains and byte bounds, run by both stores (in memory and in a
real Redis): one entry per turn linked to its parent, a chain read whole or refused,
storage linear in what was sent, and the bytes bound evicting the least recently used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from proxy.chains.entry import Stored, Turn
from proxy.chains.memory import MemoryStore
from proxy.chains.redis_store import KEY_PREFIX, TOTAL, RedisStore
from proxy.chains.store import ChainBroken, ChainTooLong, ResponseStore
from tests.chains.test_store import KINDS, TTL, entry
from tests.sessions.helpers import FakeClock
from tests.support.redis_server import RedisServer

BIG = 32 * 1024 * 1024


@pytest.fixture(params=KINDS)
async def make_store(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[[int], ResponseStore]]:
    """Builds stores of one kind, bounded to the bytes given; closes them after."""
    built: list[ResponseStore] = []

    def make(max_bytes: int) -> ResponseStore:
        if request.param == "memory":
            built.append(MemoryStore(10_000, TTL, FakeClock(), max_bytes=max_bytes))
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            built.append(RedisStore(server.url, TTL, 10_000, max_bytes=max_bytes, timeout=5.0))
        return built[-1]

    try:
        yield make
    finally:
        for each in built:
            await each.aclose()


async def three_turns(store: ResponseStore) -> list[Stored]:
    turns = [entry(1), entry(2, parent="a"), entry(3, parent="b")]
    for key, turn in zip("abc", turns, strict=True):
        assert await store.put(key, turn.encode())
    return turns


async def test_a_chain_is_read_by_its_parent_links(
    make_store: Callable[[int], ResponseStore],
) -> None:
    store = make_store(BIG)
    turns = await three_turns(store)
    chain = await store.chain("c", BIG)
    assert chain is not None
    assert chain.entries == [Turn(t.items(), t.session_key, t.session_shown) for t in turns]
    assert chain.size == sum(len(t.encode()) for t in turns)
    assert await store.chain("nothing", BIG) is None


async def test_a_chain_whose_ancestor_is_gone_is_broken(
    make_store: Callable[[int], ResponseStore],
) -> None:
    store = make_store(BIG)
    await three_turns(store)
    await store.delete("a")
    with pytest.raises(ChainBroken):
        await store.chain("c", BIG)
    assert await store.get("c") == entry(3, parent="b")  # the entry itself is still held


async def test_a_chain_past_the_chain_bound_is_refused(
    make_store: Callable[[int], ResponseStore],
) -> None:
    store = make_store(BIG)
    turns = await three_turns(store)
    with pytest.raises(ChainTooLong):
        await store.chain("c", sum(len(t.encode()) for t in turns) - 1)


async def test_past_its_bytes_the_least_recently_used_goes(
    make_store: Callable[[int], ResponseStore],
) -> None:
    one = len(entry(1).encode())
    store = make_store(2 * one + one // 2)  # room for two entries, not three
    await store.put("a", entry(1).encode())
    await store.put("b", entry(2).encode())
    assert await store.get("a") is not None  # a is now the most recent
    await store.put("c", entry(3).encode())
    assert await store.get("b") is None
    assert await store.get("a") == entry(1) and await store.get("c") == entry(3)
    await store.delete("a")  # a deleted entry's bytes are freed: both others stay
    await store.put("d", entry(4).encode())
    assert await store.get("c") == entry(3) and await store.get("d") == entry(4)


@pytest.mark.redis
async def test_redis_holds_a_chain_in_bytes_linear_in_what_was_sent(
    redis_server: RedisServer,
) -> None:
    """30 turns of 200 kB: one entry per turn, so about 6 MB (the layout that kept the
    whole chain in each entry held about 90 MB)."""
    store = RedisStore(redis_server.url, TTL, 10_000, max_bytes=1 << 30, timeout=10.0)
    inspect = redis_server.client()
    try:
        parent = None
        sent = 0
        for n in range(30):
            turn = Stored({"id": f"r{n}", "output": []}, ["x" * 200_000], None, None, parent)
            raw = turn.encode()
            sent += 200_000
            assert await store.put(f"k{n}", raw)
            parent = f"k{n}"
        held = sum(inspect.strlen(KEY_PREFIX + f"k{n}") for n in range(30))
        assert held < 1.01 * sent
        assert int(inspect.get(TOTAL) or 0) == held
        chain = await store.chain("k29", 1 << 30)
        assert chain is not None and len(chain.entries) == 30
    finally:
        inspect.close()
        await store.aclose()


@pytest.mark.redis
async def test_reading_a_chain_restarts_every_ancestors_idle_time(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, TTL, 1000, timeout=5.0)
    inspect = redis_server.client()
    try:
        await three_turns(store)
        inspect.pexpire(KEY_PREFIX + "a", 5000)
        assert await store.chain("c", BIG) is not None
        assert inspect.pttl(KEY_PREFIX + "a") > 5000
    finally:
        inspect.close()
        await store.aclose()
