"""The real vLLM engine under a hostile client, through trimproxy: vLLM answers a
body's ``request_id`` as the response id, so the proxy mints the ids it stores and
never lets a client's ``request_id`` decide one (the store in a real Redis); and vLLM
reads ``n`` as ``"2"`` or ``2.0`` as two answers, so KV admission reserves two."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.conftest import VLLM_API_KEY, StartVllmProxy
from tests.sessions.helpers import metric_value
from tests.support.redis_server import RedisServer
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

MODEL = "tiny-chat"
KEY = {"authorization": "Bearer team"}


def respond(url: str, text: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "input": text, "max_output_tokens": 8, **extra}
    return httpx.post(f"{url}/v1/responses", json=body, headers=headers, timeout=120)


@pytest.mark.redis
def test_a_clients_request_id_never_decides_a_stored_id(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, redis_server: RedisServer
) -> None:
    # The engine itself answers the body's request_id as the response id.
    engine = {"authorization": f"Bearer {VLLM_API_KEY}"}
    direct = respond(vllm_idle.base_url, "hi", engine, request_id="resp_1", store=False)
    assert direct.status_code == 200 and direct.json()["id"] == "resp_1"
    proxy = start_vllm_proxy(redis_url=redis_server.url)
    victim = respond(proxy.url, "the victim's question", KEY)
    assert victim.status_code == 200, victim.text[:300]
    vid = victim.json()["id"]
    assert vid.startswith("resp_") and len(vid) == 53
    for stream in (False, True):
        attack = respond(proxy.url, "the attacker's text", KEY, request_id=vid, stream=stream)
        assert attack.status_code == 200 and vid not in attack.text
    chosen = respond(proxy.url, "hi", KEY, request_id="resp_1")
    assert chosen.json()["id"] != "resp_1"
    got = httpx.get(f"{proxy.url}/v1/responses/{vid}", headers=KEY, timeout=30).json()
    assert got == victim.json()  # the victim's turn, as it was stored
    later = respond(proxy.url, "and then?", KEY, previous_response_id=vid)
    assert later.status_code == 200, later.text[:300]


@pytest.mark.parametrize("n", ["2", 2.0])
def test_n_spelled_as_vllm_reads_it_is_reserved_for_every_answer(
    n: object, start_vllm_proxy: StartVllmProxy
) -> None:
    """Two answers of exactly 8 tokens each: reserved as two, the engine's 16 tokens
    are no overrun of the reservation (reserved as one, they were)."""
    proxy = start_vllm_proxy(kv_admission="auto", admission_timeout=600)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 8,
        "min_tokens": 8,
        "n": n,
    }
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["choices"]) == 2
    assert answer.json()["usage"]["completion_tokens"] == 16
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert metric_value(text, "trimproxy_admission_overrun_total") == 0
    refused = httpx.post(f"{proxy.url}/v1/chat/completions", json={**body, "n": 0}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
