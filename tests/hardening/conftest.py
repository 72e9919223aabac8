"""Fixtures of the hardening suite: the misbehaving upstream, started per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.bad_upstream import BadUpstream


@pytest.fixture
def bad_upstream() -> Iterator[BadUpstream]:
    with BadUpstream() as server:
        yield server
