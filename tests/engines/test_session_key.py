"""With session limits on and session routing over two engines, a request's session
identity is worked out once (by the session step) and routing hashes that same key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import proxy.pipeline.prepare
from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.sessions.identity import identify
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream, sim_threads


@pytest.fixture
def sims() -> Iterator[list[SimUpstream]]:
    with sim_threads(2) as engines:
        yield engines


async def test_the_session_step_and_routing_share_one_identity(
    sims: list[SimUpstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        ident = identify(*args, **kwargs)
        calls.append(ident.key)
        return ident

    monkeypatch.setattr(proxy.pipeline.prepare, "identify", counted)
    settings = make_settings(
        ",".join(s.url for s in sims),
        tokenizer="approx",
        session_max_turns=50,
        upstream_metrics_interval=0,
    )
    sessions = [f"s{i}" for i in range(6)]
    async with served(create_app(settings, Metrics())) as url, httpx.AsyncClient() as client:
        for turn in range(2):
            for session in sessions:
                body = {"messages": [{"role": "user", "content": f"turn {turn} of {session}"}]}
                r = await client.post(
                    f"{url}/v1/chat/completions", json=body, headers={"x-session-id": session}
                )
                assert r.status_code == 200, r.text
    assert len(calls) == 2 * len(sessions)  # one identity a request
    # Routing still hashed the session: each one's turns met on one engine.
    for sim in sims:
        seen = [
            next(v for k, v in r["headers"] if k.lower() == "x-session-id")
            for r in sim.chat_requests()
        ]
        assert all(seen.count(s) in (0, 2) for s in sessions), seen
    assert all(sim.chat_requests() for sim in sims)
