"""What the continuation tests share: two simulated vLLM engines whose answers run
40 tokens, long enough to be cut on command mid-answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sim import SimUpstream, start_sim_thread


@pytest.fixture
def answering_sims() -> Iterator[list[SimUpstream]]:
    started = [start_sim_thread("vllm", completion_tokens=40) for _ in range(2)]
    try:
        yield started
    finally:
        for sim in started:
            sim.stop()
