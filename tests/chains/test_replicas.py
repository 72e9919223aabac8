"""A ``previous_response_id`` chain kept in a real Redis: it outlives the proxy that
stored it, and replicas serving alternate turns continue one another's responses.
Real ``trimproxy serve`` processes in front of the simulated engine."""

from __future__ import annotations

import openai
import pytest

from tests.chains.helpers import sent_bodies, turn
from tests.conftest import StartProxy
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream

pytestmark = pytest.mark.redis

BUDGET = 300
TURNS = 20


def replica(proxy_server: StartProxy, redis_server: RedisServer, **extra: object) -> ProxyProcess:
    return proxy_server(
        tokenizer="upstream",
        max_prompt_tokens=BUDGET,
        upstream_metrics_interval=0,
        redis_url=redis_server.url,
        **extra,
    )


def client_of(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.api_base, api_key="unused", max_retries=0)


def check_chain(sim: SimUpstream, previous: list[str]) -> None:
    bodies = sent_bodies(sim)
    assert len(bodies) == TURNS
    assert all(b["store"] is False and "previous_response_id" not in b for b in bodies)
    assert len(set(previous)) == TURNS


def test_a_restarted_proxy_keeps_the_chain(
    closing: Closing, proxy_server: StartProxy, redis_server: RedisServer, sim_upstream: SimUpstream
) -> None:
    proxy = replica(proxy_server, redis_server)
    ids: list[str] = []
    for n in range(TURNS):
        if n == TURNS // 2:
            proxy.stop()
            proxy = replica(proxy_server, redis_server)  # a fresh process, nothing in memory
        t = turn(closing(client_of(proxy)), n, ids[-1] if ids else None, stream=n % 2 == 1)
        assert t.forwarded <= BUDGET
        assert t.response["usage"]["input_tokens"] == t.forwarded
        ids.append(t.response["id"])
    check_chain(sim_upstream, ids)
    # The turn after the restart continued the conversation stored before it.
    after = sent_bodies(sim_upstream)[TURNS // 2]["input"]
    assert len(after) > 1


def test_two_replicas_serving_alternate_turns_keep_the_chain(
    closing: Closing, proxy_server: StartProxy, redis_server: RedisServer, sim_upstream: SimUpstream
) -> None:
    proxies = [replica(proxy_server, redis_server, session_max_turns=50) for _ in range(2)]
    ids: list[str] = []
    sessions = set()
    for n in range(TURNS):
        proxy = proxies[n % 2]
        t = turn(closing(client_of(proxy)), n, ids[-1] if ids else None, stream=n % 3 == 0)
        assert t.forwarded <= BUDGET
        ids.append(t.response["id"])
        sessions.add(t.session)
    check_chain(sim_upstream, ids)
    assert len(sessions) == 1 and None not in sessions  # one session on both replicas
    # Either replica reads what the other stored.
    assert closing(client_of(proxies[0])).responses.retrieve(ids[-1]).id == ids[-1]


def test_redis_down_is_a_503_naming_the_setting(
    closing: Closing, proxy_server: StartProxy, redis_server: RedisServer, sim_upstream: SimUpstream
) -> None:
    proxy = replica(proxy_server, redis_server)
    client = closing(client_of(proxy))
    first = turn(client, 0, None, stream=False).response["id"]
    redis_server.stop()
    sim_upstream.clear()
    with pytest.raises(openai.InternalServerError) as down:
        turn(client, 1, first, stream=False)
    assert down.value.status_code == 503
    assert down.value.code == "response_store_unavailable"
    assert "TRIMPROXY_REDIS_URL" in down.value.message
    assert sim_upstream.requests("/v1/responses") == []
    with pytest.raises(openai.InternalServerError):
        client.responses.retrieve(first)
    # A request that continues nothing is still served; its answer is not stored.
    assert turn(client, 0, None, stream=False).forwarded > 0
