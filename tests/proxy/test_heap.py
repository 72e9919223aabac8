"""The settled heap (``app.settle_heap``): the serving process's, and only its.

``trimproxy serve`` builds the app with ``serving=True``: once its lifespan has started,
what start-up built is frozen out of the collector's reach and the youngest generation
is collected less often. An app built any other way (the in-process tests, which build
hundreds in one process) leaves the collector as it found it.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable

import httpx

from proxy.app import _YOUNG_THRESHOLD
from tests.support.inprocess import StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

# The app built as `trimproxy serve` builds it, its lifespan run, in a fresh interpreter.
_SERVING = textwrap.dedent(
    """
    import asyncio, gc, json, sys
    from asgi_lifespan import LifespanManager
    from proxy.app import create_app
    from tests.support.inprocess import make_settings

    async def main() -> None:
        before = (gc.get_freeze_count(), gc.get_threshold()[0])
        app = create_app(make_settings(sys.argv[1], tokenizer="approx"), serving=True)
        async with LifespanManager(app):
            print(json.dumps({"before": before,
                              "after": (gc.get_freeze_count(), gc.get_threshold()[0])}))

    asyncio.run(main())
    """
)


def test_the_serving_process_freezes_its_start_up_heap(sim_upstream: SimUpstream) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SERVING, sim_upstream.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == [0, 700]  # CPython's defaults, untouched until then
    frozen, threshold = seen["after"]
    assert frozen > 10_000  # the modules, the app, the counter: tens of thousands
    assert threshold == _YOUNG_THRESHOLD


async def test_an_app_built_for_tests_leaves_the_collector_alone(app_proxy: StartApp) -> None:
    before = (gc.get_freeze_count(), gc.get_threshold())
    proxy = await app_proxy(tokenizer="approx")
    assert (await proxy.client.get("/healthz")).status_code == 200
    assert (gc.get_freeze_count(), gc.get_threshold()) == before


def test_a_served_answer_names_no_server(proxy_server: Callable[..., ProxyProcess]) -> None:
    """uvicorn's own header is off (``server_header=False``): an answer says nothing of
    the software behind it; the proxy's request id is there."""
    proxy = proxy_server(tokenizer="approx")
    answer = httpx.get(proxy.url + "/healthz", timeout=10)
    assert answer.status_code == 200
    assert "server" not in answer.headers
    assert "x-request-id" in answer.headers
