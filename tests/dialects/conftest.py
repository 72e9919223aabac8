"""What the dialects' route tests share: one simulated vLLM engine on its own thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sim import SimUpstream, sim_threads


@pytest.fixture
def sim() -> Iterator[SimUpstream]:
    with sim_threads(1) as engines:
        yield engines[0]
