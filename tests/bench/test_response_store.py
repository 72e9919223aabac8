"""``bench/response_store.py`` on a small scale: the store's bytes per stored turn stay
about the conversation's own, in memory and in a real Redis, whatever the chain's
length (the earlier layout, each entry the whole chain so far, grew with its square)."""

from __future__ import annotations

import asyncio

import pytest

from bench import response_store

pytestmark = pytest.mark.redis


def test_storage_is_linear_in_the_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    rows = asyncio.run(response_store.run([1, 30, 60], 5_000))
    for row in rows:
        size = row["conversation"]
        assert row["memory"] < 1.05 * size
        if row["turns"] > 1:  # one small turn: the stores' fixed structures dominate
            assert row["traced"] < 1.2 * size, row
            assert row["redis"] < 1.5 * size, row
    assert response_store.main(["--turns", "1,3", "--turn-bytes", "100"]) == 0
    assert "whole-chain layout" in capsys.readouterr().out
