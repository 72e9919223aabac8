"""Fixtures of the ledger tests: fresh metrics (``redis_server`` is the suite's)."""

from __future__ import annotations

import pytest

from proxy.metrics import Metrics


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()
