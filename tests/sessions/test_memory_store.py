"""The in-memory store's bounds: LRU by count, idle TTL, and the gauge."""

from __future__ import annotations

from proxy.sessions.identity import hash_conversation
from proxy.sessions.memory import MemoryStore
from proxy.sessions.rule import Limits
from tests.sessions.helpers import conversation

LIMITS = Limits(max_turns=3, max_age=None, action="reset", idle_ttl=10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_least_recently_used_sessions_are_evicted_beyond_the_bound() -> None:
    store = MemoryStore(max_entries=3, clock=Clock())
    for key in ("a", "b", "c"):
        await store.admit(key, hash_conversation(conversation(4)), LIMITS)
    await store.admit("a", hash_conversation(conversation(5)), LIMITS)  # a is fresh again
    await store.admit("d", hash_conversation(conversation(1)), LIMITS)
    assert store.held() == 3
    assert store.state("b") is None  # the least recently used
    assert all(store.state(k) is not None for k in ("a", "c", "d"))


async def test_idle_sessions_expire_and_their_reset_point_with_them() -> None:
    clock = Clock()
    store = MemoryStore(max_entries=100, clock=clock)
    assert (await store.admit("a", hash_conversation(conversation(4)), LIMITS)).outcome == "reset"
    clock.now += 9
    await store.admit("b", hash_conversation(conversation(1)), LIMITS)
    assert (await store.admit("a", hash_conversation(conversation(5)), LIMITS)).turn == 2
    clock.now += 10.5  # a idle for 10.5 s > 10, b for 10.5 s too
    await store.admit("c", hash_conversation(conversation(1)), LIMITS)
    assert store.held() == 1
    # State lost: the turn is derived from the request again, so turn 6 > 3 resets.
    decision = await store.admit("a", hash_conversation(conversation(6)), LIMITS)
    assert (decision.outcome, decision.base) == ("reset", 5)
