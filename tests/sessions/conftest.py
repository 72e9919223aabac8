"""A real ``redis-server`` on a free loopback port, started and stopped by the tests.

``redis_server`` is per test (a start is ~20 ms), so no state leaks between tests and
a test may stop and restart it on the same port to simulate an outage.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
