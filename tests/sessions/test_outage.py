"""The Redis store when Redis is down, hangs, or comes back."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import pytest

from proxy.sessions.identity import hash_conversation
from proxy.sessions.redis_store import RedisStore
from proxy.sessions.rule import Limits
from proxy.sessions.store import StoreUnavailable
from tests.sessions.helpers import conversation
from tests.support.processes import free_port
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

# How long a test waits for a store call before it calls it a hang: a guard, not a
# measurement (the store's deadlines are far shorter).
HANG_GUARD = 30.0
LIMITS = Limits(max_turns=3, max_age=None, action="reset", idle_ttl=60)
PROBE = hash_conversation(conversation(4))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trimproxy.sessions" and r.levelno == logging.WARNING
    ]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung Redis."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


async def test_dead_redis_fails_fast_and_then_without_trying(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    # A deadline no refusal waits for: failing on the refused connection is failing fast.
    store = RedisStore(redis_server.url, timeout=60.0, retry_interval=5.0, clock=lambda: now[0])
    try:
        redis_server.stop()
        with pytest.raises(StoreUnavailable) as refused:
            await asyncio.wait_for(store.admit("k", PROBE, LIMITS), HANG_GUARD)
        assert not isinstance(refused.value.__cause__, TimeoutError), refused.value.__cause__
        redis_server.start()  # up again, but inside the retry interval nobody asks it
        for _ in range(200):
            with pytest.raises(StoreUnavailable):
                await store.admit("k", PROBE, LIMITS)
        now[0] += 5.0
        assert (await store.admit("k", PROBE, LIMITS)).outcome == "reset"
    finally:
        await store.aclose()
    logged = warnings_of(caplog)  # one outage, said once, and its end
    assert len(logged) == 2 and "is back after" in logged[1], logged


async def test_hung_redis_times_out_after_the_deadline(
    silent_server: int, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(f"redis://127.0.0.1:{silent_server}/0", timeout=0.3)
    try:
        with pytest.raises(StoreUnavailable) as hung:
            await asyncio.wait_for(store.admit("k", PROBE, LIMITS), HANG_GUARD)
    finally:
        await store.aclose()
    # The store's own deadline ended it (the guard would raise outside the store).
    assert isinstance(hung.value.__cause__, TimeoutError), hung.value.__cause__
    assert "unavailable (TimeoutError)" in warnings_of(caplog)[0]


async def test_an_outage_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    store = RedisStore(
        f"redis://127.0.0.1:{free_port()}/0",
        retry_interval=1.0,
        log_interval=30.0,
        clock=lambda: now[0],
    )
    try:
        for _ in range(130):  # 65 s of requests, two a second, half of them skipped
            with pytest.raises(StoreUnavailable):
                await store.admit("k", PROBE, LIMITS)
            now[0] += 0.5
    finally:
        await store.aclose()
    logged = warnings_of(caplog)
    assert len(logged) == 3, logged  # at 0 s, 30 s, 60 s; 0.5 s to 30 s is 60 requests
    assert "unavailable (ConnectionError)" in logged[0]
    assert "still unavailable after 30 s; 60 requests unchecked" in logged[1]


async def test_limits_apply_again_after_redis_restarts(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    store = RedisStore(redis_server.url, retry_interval=0.2, clock=lambda: now[0])
    try:
        assert (await store.admit("k", PROBE, LIMITS)).outcome == "reset"
        redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.admit("k", PROBE, LIMITS)
        redis_server.start()
        now[0] += 0.25
        # Redis ran without persistence, so the session starts over: turn 4 > 3 again.
        decision = await store.admit("k", PROBE, LIMITS)
        assert (decision.outcome, decision.base) == ("reset", 3)
        assert (await store.admit("k", PROBE, LIMITS)).outcome == "pass"
    finally:
        await store.aclose()
    logged = warnings_of(caplog)
    assert len(logged) == 2 and "is back after" in logged[1]
