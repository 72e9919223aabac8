"""The response store's contract, run by both stores: in memory, and in a real Redis.

Every case runs against both, so the two cannot drift: the entries bound (least
recently used first) included. The memory store's idle TTL is checked on a fake clock;
Redis's TTL on the key itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from proxy.chains.entry import Stored
from proxy.chains.memory import MemoryStore
from proxy.chains.redis_store import KEY_PREFIX, LINE, RedisStore
from proxy.chains.store import ResponseStore, StoreUnavailable
from tests.sessions.helpers import FakeClock
from tests.support.redis_server import RedisServer

TTL = 60.0


def entry(n: int, *, session: str | None = None, parent: str | None = None) -> Stored:
    text = {"type": "output_text", "text": f"a{n}"}
    output = [{"type": "message", "role": "assistant", "content": [text]}]
    response = {"id": f"resp_{n}", "object": "response", "output": output}
    return Stored(response, [{"role": "user", "content": f"q{n}"}], session, session, parent)


KINDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


def build(request: pytest.FixtureRequest, max_entries: int) -> ResponseStore:
    if request.param == "memory":
        return MemoryStore(max_entries=max_entries, ttl=TTL, clock=FakeClock())
    server: RedisServer = request.getfixturevalue("redis_server")
    return RedisStore(server.url, TTL, max_entries, timeout=5.0)


@pytest.fixture(params=KINDS)
async def make_store(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[[int], ResponseStore]]:
    """Builds stores of one kind, bounded to the entries given; closes them after."""
    built: list[ResponseStore] = []

    def make(max_entries: int) -> ResponseStore:
        built.append(build(request, max_entries))
        return built[-1]

    try:
        yield make
    finally:
        for each in built:
            await each.aclose()


@pytest.fixture
def store(make_store: Callable[[int], ResponseStore]) -> ResponseStore:
    return make_store(1000)


@pytest.fixture
def two_entries(make_store: Callable[[int], ResponseStore]) -> ResponseStore:
    """A store bounded to two entries."""
    return make_store(2)


async def test_a_stored_response_reads_back_whole(store: ResponseStore) -> None:
    kept = entry(1, session="ns:h:abc")
    await store.put("k1", kept.encode())
    assert await store.get("k1") == kept
    assert (await store.get("k1") or kept).items() == [
        {"role": "user", "content": "q1"},
        *kept.response["output"],
    ]


async def test_an_unknown_key_is_none(store: ResponseStore) -> None:
    assert await store.get("nothing") is None


async def test_delete_says_whether_there_was_one(store: ResponseStore) -> None:
    await store.put("k1", entry(1).encode())
    assert await store.delete("k1") is True
    assert await store.get("k1") is None
    assert await store.delete("k1") is False


async def test_a_stored_entry_is_never_overwritten(store: ResponseStore) -> None:
    assert await store.put("k1", entry(1).encode()) is True
    assert await store.put("k1", entry(2).encode()) is False
    assert await store.get("k1") == entry(1)


async def test_keys_are_apart(store: ResponseStore) -> None:
    await store.put("k1", entry(1).encode())
    await store.put("k2", entry(2).encode())
    await store.delete("k1")
    assert await store.get("k2") == entry(2)


async def test_past_its_entries_the_least_recently_used_goes(two_entries: ResponseStore) -> None:
    store = two_entries
    await store.put("a", entry(1).encode())
    await store.put("b", entry(2).encode())
    assert await store.get("a") is not None  # a is now the most recent
    await store.put("c", entry(3).encode())
    assert await store.get("b") is None
    assert await store.get("a") == entry(1) and await store.get("c") == entry(3)
    await store.delete("a")  # a deleted entry leaves the line: both others stay
    await store.put("d", entry(4).encode())
    assert await store.get("c") == entry(3) and await store.get("d") == entry(4)
    both = len(entry(3).encode()) + len(entry(4).encode())
    assert store.held() in ((2, both), None)  # None: shared, Redis holds the count


@pytest.mark.redis
async def test_redis_holds_at_most_its_entries_and_their_line(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, TTL, 3, timeout=5.0)
    inspect = redis_server.client()
    try:
        for n in range(10):
            await store.put(f"k{n}", entry(n).encode())
        kept = sorted(
            k.decode() if isinstance(k, bytes) else k for k in inspect.keys(KEY_PREFIX + "*")
        )
        assert kept == [KEY_PREFIX + f"k{n}" for n in (7, 8, 9)]
        assert inspect.zcard(LINE) == 3
        assert 0 < inspect.pttl(LINE) <= TTL * 1000  # the line goes with the entries
    finally:
        inspect.close()
        await store.aclose()


async def test_the_memory_store_forgets_an_entry_idle_past_its_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(max_entries=10, ttl=TTL, clock=clock)
    await store.put("a", entry(1).encode())
    await store.put("b", entry(2).encode())
    clock.now += TTL - 1
    assert await store.get("a") is not None  # a use restarts its idle time
    clock.now += 2
    assert await store.get("b") is None  # idle TTL + 1 s
    assert await store.get("a") == entry(1)
    assert store.held() == (1, len(entry(1).encode()))


@pytest.mark.redis
async def test_redis_keeps_each_response_with_its_ttl_and_a_read_restarts_it(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, TTL, 1000, timeout=5.0)
    inspect = redis_server.client()
    try:
        await store.put("k1", entry(1).encode())
        first = inspect.pttl(KEY_PREFIX + "k1")
        assert 0 < first <= TTL * 1000
        inspect.pexpire(KEY_PREFIX + "k1", 5000)
        assert await store.get("k1") == entry(1)
        assert inspect.pttl(KEY_PREFIX + "k1") > 5000  # GETEX restarted the idle time
        inspect.set(KEY_PREFIX + "k2", b"not an entry")
        assert await store.get("k2") is None
        assert store.held() is None
    finally:
        inspect.close()
        await store.aclose()


@pytest.mark.redis
async def test_redis_down_is_unavailable_at_once_until_it_retries(
    redis_server: RedisServer,
) -> None:
    clock = FakeClock()
    store = RedisStore(redis_server.url, TTL, 1000, timeout=2.0, retry_interval=5.0, clock=clock)
    try:
        await store.put("k1", entry(1).encode())
        redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.get("k1")
        assert await store.ping() is False
        redis_server.start()
        with pytest.raises(StoreUnavailable):  # inside the retry interval: not tried
            await store.get("k1")
        clock.now += 5.0
        assert await store.get("k1") is None  # a new, empty Redis (no persistence)
    finally:
        await store.aclose()
