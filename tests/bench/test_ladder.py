"""``bench/ladder.py``: its ratio means something only if the body that needs clearing
is cleared (and fits) while the same body under a wide window is forwarded as it came.
Run on a small scale; no timing is asserted."""

from __future__ import annotations

import asyncio

from bench import ladder


def test_one_body_is_cleared_and_the_same_body_goes_whole() -> None:
    r = asyncio.run(ladder.measure(rounds=30, requests=2, warmup=1, repeats=1))
    assert r["forwarded_whole"] is True
    assert r["outputs_cleared"] > 0
    assert r["forwarded"] <= r["budget"] < r["received"]
    assert r["whole"] > 0 and r["cleared"] > 0


def test_a_200_round_body_is_about_150_kb() -> None:
    import orjson

    assert 130_000 <= len(orjson.dumps(ladder.agent_body(200))) <= 170_000
