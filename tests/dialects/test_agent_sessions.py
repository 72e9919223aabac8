"""The session of a coding agent's request: the header it names its conversation by
(the Codex CLI's ``session_id``), read on the dialects' routes when the configured
``TRIMPROXY_SESSION_HEADER`` is absent; over real HTTP in front of the simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.sessions.gate import SESSION_ID
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream

TURN = [{"role": "user", "content": "hello there"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": "sim-model", "input": TURN, "store": False},
    "/v1/messages": {"model": "sim-model", "messages": TURN, "max_tokens": 8},
    "/v1/chat/completions": {"model": "sim-model", "messages": TURN, "max_tokens": 8},
}


@pytest.fixture
async def proxy_url(sim: SimUpstream) -> AsyncIterator[str]:
    settings = make_settings(sim.url, session_max_turns=50, upstream_metrics_interval=0)
    async with served(create_app(settings, Metrics())) as url:
        yield url


async def session_of(url: str, path: str, headers: dict[str, str]) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        reply = await client.post(path, json=BODIES[path], headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.headers[SESSION_ID]


@pytest.mark.parametrize("name", ["session_id", "session-id"])
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
async def test_an_agents_session_header_names_the_session(
    proxy_url: str, path: str, name: str
) -> None:
    assert await session_of(proxy_url, path, {name: "agent-conversation-7"}) == (
        "agent-conversation-7"
    )


async def test_the_configured_header_comes_first(proxy_url: str) -> None:
    both = {"x-session-id": "configured", "session_id": "agent"}
    assert await session_of(proxy_url, "/v1/responses", both) == "configured"


async def test_chat_keeps_its_one_header(proxy_url: str) -> None:
    # Chat clients send no agent header; a chat request's session is the configured
    # header's, the user or the fingerprint, as before.
    shown = await session_of(proxy_url, "/v1/chat/completions", {"session_id": "agent"})
    assert shown.startswith("fp-")
