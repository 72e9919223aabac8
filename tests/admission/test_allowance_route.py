"""The completion allowance on the chat route, against the sim over HTTP: the cap lowered
and filled in (and said so), ``n`` answers reserved, and answers without ``max_tokens``
that run long (the sim's ``completion_tokens``, as ``ignore_eos`` does on vLLM): a
streamed one grows its reservation as it goes, and both kinds are counted as overruns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from tests.sessions.helpers import metric_value
from tests.support.inprocess import InProcessProxy, StartApp
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

CAPPED = "x-trimproxy-max-tokens-capped"
WAIT = "x-trimproxy-admission-wait-ms"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], **fields}


async def metric(proxy: InProcessProxy, name: str) -> float:
    return metric_value(await proxy.metrics_text(), name)


async def test_the_cap_lowers_and_fills_in_max_tokens(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx", max_completion_tokens=100)
    sim_upstream.configure(completion_tokens=500)
    asked = await proxy.client.post("/v1/chat/completions", json=body(max_tokens=900))
    assert asked.status_code == 200 and asked.headers[CAPPED] == "900"
    assert asked.json()["usage"]["completion_tokens"] == 100
    named = await proxy.client.post("/v1/chat/completions", json=body())
    assert named.status_code == 200 and CAPPED not in named.headers
    within = await proxy.client.post("/v1/chat/completions", json=body(max_tokens=50))
    assert CAPPED not in within.headers
    sent = [r["json"] for r in sim_upstream.chat_requests()[-3:]]
    assert [s.get("max_tokens") for s in sent] == [100, 100, 50]


async def test_n_answers_are_reserved_each(app_proxy: StartApp, sim_upstream: SimUpstream) -> None:
    # Each request: ~10 prompt tokens + n x 300. One of n=1 and one of n=2 fit in 1,000
    # side by side; one of n=1 and one of n=3 do not, and the second waits.
    proxy = await app_proxy(tokenizer="approx", kv_admission="1000")
    sim_upstream.configure(delay_seconds=0.4, completion_tokens=4)

    async def pair(n: int) -> list[bool]:
        answers = await asyncio.gather(
            proxy.client.post("/v1/chat/completions", json=body(max_tokens=300)),
            proxy.client.post("/v1/chat/completions", json=body(max_tokens=300, n=n)),
        )
        assert all(a.status_code == 200 for a in answers)
        return [WAIT in a.headers for a in answers]

    assert await pair(2) == [False, False]
    assert True in await pair(3)
    assert await metric(proxy, "trimproxy_kv_reserved_tokens") == 0


def test_a_long_streamed_answer_grows_its_reservation(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream
) -> None:
    """A real proxy process (the in-process transport hands a stream over whole)."""
    proxy = proxy_server(tokenizer="approx", kv_admission="100000", default_completion_reserve=100)
    sim_upstream.configure(completion_tokens=600, tokens_per_second=300)

    def reserved() -> float:
        text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
        return metric_value(text, "trimproxy_kv_reserved_tokens")

    first = peak = 0.0
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=body(stream=True), timeout=30
    ) as response:
        assert response.status_code == 200
        events = 0
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            events += 1
            if events == 2:
                first = reserved()
            if events == 400:
                peak = reserved()
    assert 100 < first < 200  # prompt + the default reserve of 100
    assert peak >= first + 300 - 1  # grown with the answer, ahead of it
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0
    assert metric_value(text, "trimproxy_admission_overrun_total") == 1
    assert metric_value(text, "trimproxy_admission_overrun_tokens_total") == 500


async def test_overruns_are_counted_and_the_cap_prevents_them(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    sim_upstream.configure(completion_tokens=600)
    loose = await app_proxy(tokenizer="approx", kv_admission="100000")
    for payload in (body(), body(max_tokens=700)):  # only the first one may run past
        assert (await loose.client.post("/v1/chat/completions", json=payload)).status_code == 200
    assert await metric(loose, "trimproxy_admission_overrun_total") == 1
    assert await metric(loose, "trimproxy_admission_overrun_tokens_total") == 600 - 512

    capped = await app_proxy(tokenizer="approx", kv_admission="100000", max_completion_tokens=200)
    for payload in (body(), body(stream=True)):
        assert (await capped.client.post("/v1/chat/completions", json=payload)).status_code == 200
    assert await metric(capped, "trimproxy_admission_overrun_total") == 0
