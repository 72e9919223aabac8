"""A simulated vLLM / FastChat OpenAI server: the test suite's upstream, the
``trimproxy sim`` demo, and the benchmarks' mock.

``build_app(SimConfig(...))`` gives an aiohttp application; ``serve`` runs it until
cancelled and ``run`` blocks (the command line). See ``proxy/sim/README.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.sim.config import SimConfig

if TYPE_CHECKING:
    from proxy.sim.server import build_app, run, serve

__all__ = ["SimConfig", "build_app", "run", "serve"]


def __getattr__(name: str) -> Any:
    # The server (and aiohttp.web) loads on first use, so that importing the sim's
    # config or command line (``trimproxy sim --help``) stays cheap.
    if name in ("build_app", "run", "serve"):
        from proxy.sim import server

        return getattr(server, name)
    raise AttributeError(f"module 'proxy.sim' has no attribute {name!r}")
