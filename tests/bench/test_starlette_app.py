"""``bench/starlette_app.py``: the proxy as a plain Starlette app, which the benches
set beside the ``FastAPI`` one to measure what FastAPI's own layers cost
(docs/performance.md section 1). The figure only means that if the two are the same
proxy but for FastAPI: the same answer, the same body forwarded, and no ``/docs``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.support.processes import REPO_ROOT, ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"
SETTINGS: dict[str, Any] = {
    "tokenizer": "approx",
    "upstream_metrics_interval": 0,
    "max_prompt_tokens": 120,
}


def conversation() -> dict[str, Any]:
    """Over the budget: the proxy trims it, so the forwarded body is the proxy's own."""
    old = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 60}
        for i in range(6)
    ]
    messages = [{"role": "system", "content": "Be brief."}, *old]
    return {
        "model": "sim-model",
        "max_tokens": 8,
        "messages": [*messages, {"role": "user", "content": "hi"}],
    }


def ask(proxy: ProxyProcess, sim: SimUpstream) -> tuple[httpx.Response, dict[str, Any], int]:
    sim.clear()
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        answer = client.post(CHAT, json=conversation())
        docs = client.get("/docs").status_code
    (forwarded,) = sim.chat_requests()
    return answer, forwarded, docs


def test_the_starlette_variant_is_the_same_proxy_less_fastapi(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    fastapi_app = proxy_server(**SETTINGS)
    script = str(REPO_ROOT / "bench" / "starlette_app.py")
    variant = ProxyProcess(
        settings=SETTINGS, env={"TRIMPROXY_UPSTREAM_URL": sim_upstream.url}, command=(script,)
    )
    with variant:
        plain_answer, plain_forwarded, plain_docs = ask(variant, sim_upstream)
    answer, forwarded, docs = ask(fastapi_app, sim_upstream)

    assert answer.status_code == plain_answer.status_code == 200
    for header in ("x-trimproxy-prompt-tokens", "x-trimproxy-trimmed-messages"):
        assert answer.headers[header] == plain_answer.headers[header], header
    assert int(answer.headers["x-trimproxy-trimmed-messages"]) > 0
    assert forwarded["body"] == plain_forwarded["body"]
    assert (docs, plain_docs) == (200, 404)
