"""``trimproxy serve`` with a plain Starlette app: what being a FastAPI app costs.

``proxy.app.create_app`` returns a ``FastAPI`` (docs/fastapi.md). This runs the same
proxy, settings, middleware and handlers with ``starlette.applications.Starlette`` in
its place, as the app was before it became a FastAPI one again, so that
``bench/callgrind_cost.py --targets trimproxy,trimproxy-starlette`` measures FastAPI's
own share of one request path side by side: its ``__call__`` (the telemetry check)
and the exception-telemetry and body-limit middleware that every request passes.
A bench target only, never a way to serve: ``/docs`` and FastAPI's routes are gone.

    .venv/bin/python bench/starlette_app.py serve --port 8080   # trimproxy serve's flags
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastapi.routing import APIRoute  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import BaseRoute, Route  # noqa: E402

import proxy.app  # noqa: E402
import proxy.routes  # noqa: E402
from proxy.cli import main  # noqa: E402


class StarletteApp(Starlette):
    """Takes what ``create_app`` hands ``FastAPI``; keeps only the lifespan."""

    def __init__(self, *, lifespan: Any, **fastapi_only: Any) -> None:
        super().__init__(lifespan=lifespan)


def starlette_routes() -> list[BaseRoute]:
    """The proxy's routes, each ``APIRoute`` as Starlette's own ``Route`` (an
    ``APIRoute`` needs the request scope that FastAPI's middleware sets up)."""
    return [
        Route(r.path, r.endpoint, methods=sorted(r.methods)) if isinstance(r, APIRoute) else r
        for r in proxy.routes.routes()
    ]


if __name__ == "__main__":
    # create_app looks both names up in proxy.app when it builds the app.
    proxy.app.FastAPI = StarletteApp  # type: ignore[misc,assignment]
    proxy.app.routes = starlette_routes
    raise SystemExit(main())
