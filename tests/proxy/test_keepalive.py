"""The proxy drops an idle upstream connection before the engine's server does."""

from __future__ import annotations

import uvicorn

from proxy.upstream import IDLE_KEEPALIVE, Upstream
from tests.support.inprocess import make_settings


def _server_keepalive() -> float:
    # vLLM's and FastChat's OpenAI servers run uvicorn with its default (vLLM: its
    # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default too).
    return float(uvicorn.Config(app=lambda: None).timeout_keep_alive)


async def test_idle_connections_go_before_the_engines_server_closes_them() -> None:
    assert _server_keepalive() > IDLE_KEEPALIVE
    upstream = Upstream(make_settings("http://127.0.0.1:9"))
    try:
        connector = upstream.transport._session.connector
        assert connector is not None
        assert connector._keepalive_timeout == IDLE_KEEPALIVE
    finally:
        await upstream.aclose()
