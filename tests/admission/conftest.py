"""Fixtures of the ledger tests: a real ``redis-server`` per test, fresh metrics."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.metrics import Metrics
from tests.sessions.redis_server import REDIS_BIN, RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    if REDIS_BIN is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="trimproxy-redis-") as tmp:
        server = RedisServer(REDIS_BIN, Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()
