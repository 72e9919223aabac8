"""trimproxy: an OpenAI-compatible proxy that keeps chat prompts inside a token budget.

The version lives in one place, ``pyproject.toml``; ``proxy.__version__`` reads it
from the installed package's metadata, on first use rather than at import.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version


@cache
def _version() -> str:
    try:
        return version("trimproxy")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'proxy' has no attribute {name!r}")
