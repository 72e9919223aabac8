"""Whether the upstream serves the proxy: each engine's ``GET /v1/models`` with the
key (``/readyz``, and the health prober's probe)."""

from __future__ import annotations

import asyncio

from proxy.engines.engine import Engine
from proxy.upstream.calls import Readiness, UpstreamCallFailed
from proxy.upstream.client import Upstream


async def ready(upstream: Upstream) -> Readiness:
    """Every engine asked at once; ready when one of them is (the detail says how many)."""
    engines = upstream.engines.all()
    if len(engines) == 1:
        return await engine_ready(upstream, engines[0])
    answers = await asyncio.gather(*(engine_ready(upstream, e) for e in engines))
    up = sum(a.ready for a in answers)
    detail = f"{up} of {len(engines)} engines answer GET /v1/models"
    down = [f"{e.label}: {a.detail}" for e, a in zip(engines, answers, strict=True) if not a.ready]
    if down:
        detail += "; " + "; ".join(down[:8])
    return Readiness(up > 0, detail, up, len(engines))


async def engine_ready(upstream: Upstream, engine: Engine) -> Readiness:
    """Whether ``engine`` serves us: ``GET /v1/models`` with the key.

    401/403 is not ready (the key is missing or wrong: nothing would be trimmed and
    every request would fail), nor is a 5xx or no answer at all.
    """
    try:
        await upstream.call("GET", "/v1/models", engine=engine)
    except UpstreamCallFailed as exc:
        if exc.status is None:
            return Readiness(False, f"GET /v1/models got no answer ({exc.reason})", 0)
        if exc.status in (401, 403):
            return Readiness(
                False,
                f"GET /v1/models answered HTTP {exc.status}: set TRIMPROXY_UPSTREAM_API_KEY "
                "to the key the upstream expects",
                0,
            )
        if exc.status >= 500:
            return Readiness(False, f"GET /v1/models answered HTTP {exc.status}", 0)
        return Readiness(True, f"GET /v1/models answered HTTP {exc.status}")
    return Readiness(True, "GET /v1/models answered HTTP 200")
