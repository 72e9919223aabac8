"""The version is stated once, in pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import proxy

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_version_is_pyprojects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert proxy.__version__ == project["version"]
