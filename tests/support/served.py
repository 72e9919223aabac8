"""An app served by uvicorn on 127.0.0.1 in the test's own event loop.

For tests that need real HTTP but build the app themselves (an operator's additions to
``create_app(...)``'s app): the lifespan runs as under ``trimproxy serve``, and the
test still holds the app object and whatever its middleware recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.types import ASGIApp

from tests.support.processes import free_port


@asynccontextmanager
async def served(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` (lifespan on) until the block ends; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # start-up failed: its error
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
