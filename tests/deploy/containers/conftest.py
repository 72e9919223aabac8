"""The engine that scripts/container-test.sh picked and the images it built; every test
here is skipped, naming the script, when pytest runs without it."""

from __future__ import annotations

import pytest

from tests.deploy.containers.engine import Engine, from_environment


@pytest.fixture(scope="session")
def picked() -> tuple[Engine, tuple[str, ...], dict[str, str]]:
    found = from_environment()
    if found is None:
        pytest.skip("needs a container engine and the built images: scripts/container-test.sh")
    return found


@pytest.fixture(scope="session")
def engine(picked: tuple[Engine, tuple[str, ...], dict[str, str]]) -> Engine:
    return picked[0]


@pytest.fixture(scope="session")
def images(picked: tuple[Engine, tuple[str, ...], dict[str, str]]) -> dict[str, str]:
    return picked[2]
