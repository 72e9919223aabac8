"""The session rule, run by both stores: in memory, and as Lua in a real Redis.

Every test here runs against both, so the Lua script and ``decide`` cannot drift.
Time passes on a fake clock for the memory store and for real in Redis (``later``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

import pytest

from proxy.sessions.identity import hash_conversation
from proxy.sessions.memory import MemoryStore
from proxy.sessions.redis_store import KEY_PREFIX, RedisStore
from proxy.sessions.rule import Decision, Limits
from proxy.sessions.store import SessionStore
from tests.sessions.helpers import FakeClock, conversation, later
from tests.support.redis_server import RedisServer

TURNS3 = Limits(max_turns=3, max_age=None, action="reset", idle_ttl=60)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    built: SessionStore
    if request.param == "memory":
        built = MemoryStore(max_entries=1000, clock=FakeClock())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        # The rule is under test, not the deadline (test_outage.py): a loaded machine
        # must not turn 40 concurrent checks into StoreUnavailable.
        built = RedisStore(server.url, timeout=5.0)
    try:
        yield built
    finally:
        await built.aclose()


async def admit(
    store: SessionStore, users: int, limits: Limits = TURNS3, *, key: str = "k", tag: str = "a"
) -> Decision:
    return await store.admit(key, hash_conversation(conversation(users, tag=tag)), limits)


def shape(d: Decision) -> tuple[str, int, int, str | None]:
    return (d.outcome, d.base, d.turn, d.reason)


async def test_turns_pass_to_the_limit_then_reset_and_grow_again(store: SessionStore) -> None:
    seen = [shape(await admit(store, users)) for users in range(1, 9)]
    assert seen == [
        ("pass", 0, 1, None),
        ("pass", 0, 2, None),
        ("pass", 0, 3, None),
        ("reset", 3, 1, "turns"),  # turn 4 hits the limit of 3: reset at the 4th user message
        ("pass", 3, 2, None),
        ("pass", 3, 3, None),
        ("reset", 6, 1, "turns"),
        ("pass", 6, 2, None),
    ]


async def test_a_retried_request_does_not_count_twice(store: SessionStore) -> None:
    for users in (1, 2, 3):
        await admit(store, users)
    assert shape(await admit(store, 4)) == ("reset", 3, 1, "turns")
    assert shape(await admit(store, 4)) == ("pass", 3, 1, None)
    # An older request replayed after the reset is before the reset point: turn 3.
    assert shape(await admit(store, 3)) == ("pass", 0, 3, None)
    assert shape(await admit(store, 5)) == ("pass", 3, 2, None)


async def test_forty_concurrent_identical_requests_reset_once(store: SessionStore) -> None:
    await admit(store, 1)
    decisions = await asyncio.gather(*(admit(store, 4) for _ in range(40)))
    assert [d.outcome for d in decisions].count("reset") == 1
    assert {(d.base, d.turn) for d in decisions} == {(3, 1)}


@pytest.mark.parametrize("action", ["reset", "reject"])
async def test_other_keys_are_unaffected(store: SessionStore, action: str) -> None:
    limits = Limits(3, None, "reset" if action == "reset" else "reject", 60)
    assert (await admit(store, 4, limits, key="one")).outcome == action
    assert shape(await admit(store, 3, limits, key="two")) == ("pass", 0, 3, None)
    assert shape(await admit(store, 2, limits, key="three")) == ("pass", 0, 2, None)


async def test_reject_keeps_rejecting_until_a_new_conversation(store: SessionStore) -> None:
    limits = Limits(3, None, "reject", 60)
    assert shape(await admit(store, 3, limits)) == ("pass", 0, 3, None)
    assert shape(await admit(store, 4, limits)) == ("reject", 0, 4, "turns")
    assert shape(await admit(store, 4, limits)) == ("reject", 0, 4, "turns")
    assert shape(await admit(store, 1, limits)) == ("pass", 0, 1, None)


@pytest.mark.parametrize("action", ["reset", "reject"])
async def test_age_limit(store: SessionStore, action: Literal["reset", "reject"]) -> None:
    limits = Limits(None, 0.3, action, 60)
    assert shape(await admit(store, 1, limits)) == ("pass", 0, 1, None)
    assert shape(await admit(store, 2, limits)) == ("pass", 0, 2, None)
    await later(store, 0.45)
    third = await admit(store, 3, limits)
    assert third.age > 0.3
    if action == "reset":
        assert shape(third) == ("reset", 2, 1, "age")
        # The reset restarted the clock: the next turn is young again.
        assert shape(await admit(store, 4, limits)) == ("pass", 2, 2, None)
    else:
        assert shape(third) == ("reject", 0, 3, "age")
        # A new conversation (one user message) restarts the session clock.
        assert shape(await admit(store, 1, limits)) == ("pass", 0, 1, None)
        assert shape(await admit(store, 2, limits)) == ("pass", 0, 2, None)


async def test_conversations_sharing_an_id_keep_their_own_reset_points(
    store: SessionStore,
) -> None:
    assert shape(await admit(store, 4, tag="a")) == ("reset", 3, 1, "turns")
    # Same session key, another history: a's reset point does not apply to it.
    assert shape(await admit(store, 2, tag="b")) == ("pass", 0, 2, None)
    assert shape(await admit(store, 4, tag="b")) == ("reset", 3, 1, "turns")
    assert shape(await admit(store, 5, tag="a")) == ("pass", 3, 2, None)
    assert shape(await admit(store, 5, tag="b")) == ("pass", 3, 2, None)
    assert shape(await admit(store, 7, tag="a")) == ("reset", 6, 1, "turns")
    assert shape(await admit(store, 6, tag="b")) == ("pass", 3, 3, None)


async def test_state_stays_small(store: SessionStore, request: pytest.FixtureRequest) -> None:
    # Twenty conversations under one id, each resetting twice: the state holds at most
    # four reset points whatever happens.
    for i in range(20):
        await admit(store, 4, tag=f"t{i}")
        await admit(store, 7, tag=f"t{i}")
    # The latest conversations keep their points: a continuation is not reset again.
    assert shape(await admit(store, 8, tag="t19")) == ("pass", 6, 2, None)
    if isinstance(store, MemoryStore):
        state = store.state("k")
        assert state is not None and len(state.resets) == 4
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        with server.client() as client:
            value = client.get(KEY_PREFIX + "k")
            ttl_ms = client.pttl(KEY_PREFIX + "k")
            keys = client.dbsize()
        assert isinstance(value, bytes) and value.count(b";") == 4
        assert len(value) < 200, value
        assert 0 < ttl_ms <= 60_000
        assert keys == 1


async def test_a_conversation_that_resets_often_holds_one_reset_point(
    store: SessionStore,
) -> None:
    for tag in ("b", "c"):
        assert (await admit(store, 4, tag=tag)).outcome == "reset"
    for users in (4, 7, 10):
        assert (await admit(store, users, tag="a")).outcome == "reset"
    assert (await admit(store, 4, tag="d")).outcome == "reset"
    # Four conversations, four points: b and c still continue from their resets.
    for tag in ("b", "c", "d"):
        assert shape(await admit(store, 5, tag=tag)) == ("pass", 3, 2, None)
    assert shape(await admit(store, 11, tag="a")) == ("pass", 9, 2, None)


async def test_a_late_stale_request_does_not_pull_the_session_back(store: SessionStore) -> None:
    assert shape(await admit(store, 7)) == ("reset", 6, 1, "turns")
    # An old request of the same conversation arrives late (a slow retry): it is
    # before the reset point, so it resets on its own turn...
    assert shape(await admit(store, 4)) == ("reset", 3, 1, "turns")
    # ...and later requests follow the latest point that matches them, not the first.
    assert shape(await admit(store, 8)) == ("pass", 6, 2, None)
    assert shape(await admit(store, 10)) == ("reset", 9, 1, "turns")
    assert shape(await admit(store, 11)) == ("pass", 9, 2, None)


async def test_a_new_conversation_does_not_keep_a_live_session_young(
    store: SessionStore,
) -> None:
    limits = Limits(None, 1.0, "reject", 60)
    assert shape(await admit(store, 1, limits)) == ("pass", 0, 1, None)
    await later(store, 0.5)
    assert shape(await admit(store, 1, limits, tag="b")) == ("pass", 0, 1, None)
    await later(store, 0.7)
    # 1.2 s since the session started: the second first turn did not restart the clock.
    late = await admit(store, 2, limits)
    assert shape(late) == ("reject", 0, 2, "age") and late.age > 1.0
