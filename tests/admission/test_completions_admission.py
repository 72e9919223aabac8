"""KV admission on ``/v1/completions``, against the sim: a request reserves its prompts
and ``prompts x n`` answers of ``max_tokens`` (each prompt is its own engine request),
and waits its turn like chat."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.sessions.helpers import metric_value
from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.sim import SimUpstream

WAIT = "x-trimproxy-admission-wait-ms"


def completion(prompts: int, n: int = 1) -> dict[str, Any]:
    prompt: Any = ["hello there"] * prompts if prompts > 1 else "hello there"
    return {"model": "sim-model", "prompt": prompt, "max_tokens": 200, "n": n}


async def post(proxy: InProcessProxy, payload: dict[str, Any]) -> httpx.Response:
    return await proxy.client.post("/v1/completions", json=payload)


async def waited(proxy: InProcessProxy, payload: dict[str, Any]) -> int:
    """How many of two such requests at once waited for the other."""
    answers = await asyncio.gather(post(proxy, payload), post(proxy, payload))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    return sum(WAIT in a.headers for a in answers)


async def test_prompts_and_answers_are_reserved(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", kv_admission="1000")
    sim_upstream.configure(delay_seconds=0.4, completion_tokens=4)
    # One prompt, one answer: about 205 each, two fit at once.
    assert await waited(proxy, completion(1)) == 0
    # Three prompts (three engine requests): about 615 each, one at a time.
    assert await waited(proxy, completion(3)) == 1
    # One prompt, three answers: the same.
    assert await waited(proxy, completion(1, n=3)) == 1
    text = await proxy.metrics_text()
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0
    assert metric_value(text, "trimproxy_admission_wait_seconds_count") == 6


async def test_a_named_session_stays_on_its_engine(
    sim_upstream_factory: Any, app_proxy: StartApp
) -> None:
    sims = [sim_upstream_factory() for _ in range(3)]
    proxy = await app_proxy(
        upstream=",".join(s.url for s in sims), tokenizer="approx", routing="session"
    )
    for session in ("alpha", "beta", "gamma", "delta"):
        for turn in range(4):
            body = {"model": "sim-model", "prompt": f"{session} {turn}", "max_tokens": 2}
            answer = await proxy.client.post(
                "/v1/completions", json=body, headers={"x-session-id": session}
            )
            assert answer.status_code == 200, answer.text
    engines = set()
    for session in ("alpha", "beta", "gamma", "delta"):
        served = [
            i
            for i, sim in enumerate(sims)
            for r in sim.requests("/v1/completions")
            if r["json"]["prompt"].startswith(session)
        ]
        assert len(served) == 4 and len(set(served)) == 1, (session, served)
        engines.update(served)
    assert len(engines) > 1  # spread by session, not all on the least loaded
