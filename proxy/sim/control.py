"""The sim's own routes under ``/_sim/``: what tests read and turn.

* ``GET /_sim/requests[?path=/v1/chat/completions]``: recorded requests, oldest first
* ``DELETE /_sim/requests``: forget them
* ``GET /_sim/state``: running/waiting requests, disconnects, KV usage, config
* ``GET /_sim/config``, ``POST /_sim/config``: read / change run-time knobs
* ``POST /_sim/reset``: back to the start config, nothing recorded, counters zero
"""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.sim.routes import json_response
from proxy.sim.state import STATE


async def sim_requests(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if request.method == "DELETE":
        state.recorder.clear()
        return json_response({"cleared": True})
    records = state.recorder.snapshot()
    path = request.query.get("path")
    if path:
        records = [r for r in records if r["path"] == path]
    return json_response(records)


async def sim_state(request: web.Request) -> web.StreamResponse:
    return json_response(request.app[STATE].describe())


async def sim_config(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if request.method == "POST":
        try:
            knobs = orjson.loads(await request.read())
            if not isinstance(knobs, dict):
                raise ValueError("expected a JSON object")
            state.configure(knobs)
        except (ValueError, TypeError) as exc:
            return json_response({"error": str(exc)}, 400)
    return json_response(state.describe())


async def sim_reset(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state.reset()
    return json_response(state.describe())


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/_sim/requests", sim_requests)
    router.add_delete("/_sim/requests", sim_requests)
    router.add_get("/_sim/state", sim_state)
    router.add_get("/_sim/config", sim_config)
    router.add_post("/_sim/config", sim_config)
    router.add_post("/_sim/reset", sim_reset)
