"""The single-flight cache (``proxy.upstream.flight``): ``fresh`` reads what ``get``
keeps, for exactly as long as ``get`` would return it without a fetch."""

from __future__ import annotations

import asyncio

from proxy.upstream.flight import Flight


def test_fresh_is_the_cached_value_until_it_expires_then_get_fetches_again() -> None:
    now = [100.0]
    fetched: list[int] = []

    async def fetch() -> str:
        fetched.append(1)
        return f"value {len(fetched)}"

    flight: Flight[str, str] = Flight(lambda value: 10.0, lambda: now[0])

    async def scenario() -> None:
        assert flight.fresh("k") is None  # nothing fetched yet
        assert await flight.get("k", fetch) == "value 1"
        now[0] = 109.9
        assert flight.fresh("k") == "value 1"
        assert flight.fresh("other") is None
        now[0] = 110.0  # the ttl ran out: neither returns the stale value
        assert flight.fresh("k") is None
        assert await flight.get("k", fetch) == "value 2"
        assert flight.fresh("k") == "value 2"

    asyncio.run(scenario())
    assert len(fetched) == 2
