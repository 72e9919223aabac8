"""A ``previous_response_id`` chain of 20 turns against the real vLLM engine, started
without its response store (its default), through trimproxy: each request sends only
its new input, trimproxy expands the chain from its own store and trims it to the
budget; every turn is served, and the engine's ``usage.input_tokens`` is trimproxy's
count. The same chain with the store in a real Redis, served by two replicas in turn
and by fresh processes after a restart in the middle."""

from __future__ import annotations

import openai
import pytest

from tests.chains.helpers import turn
from tests.e2e.conftest import StartVllmProxy
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.vllm

BUDGET = 600
TURNS = 20


def test_a_20_turn_chain_on_the_real_engine_stays_within_the_budget(
    closing: Closing,
    start_vllm_proxy: StartVllmProxy,
) -> None:
    proxy = start_vllm_proxy(max_prompt_tokens=BUDGET)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused", timeout=120))
    previous = None
    forwarded = []
    for n in range(TURNS):
        t = turn(client, n, previous, stream=n % 2 == 1, model="tiny-chat")
        assert t.forwarded <= BUDGET
        assert t.response["usage"]["input_tokens"] == t.forwarded  # the count is the engine's
        forwarded.append(t.forwarded)
        previous = t.response["id"]
    print(f"\nforwarded prompt tokens per turn: {forwarded}")
    assert max(forwarded) > forwarded[0]  # the chain grew: the engine got the history
    assert previous is not None and client.responses.retrieve(previous).id == previous


@pytest.mark.redis
def test_a_chain_in_redis_crosses_replicas_and_outlives_a_restart(
    closing: Closing,
    start_vllm_proxy: StartVllmProxy,
    redis_server: RedisServer,
) -> None:
    """Two replicas on one real Redis serve alternate turns of one 20-turn chain; in
    the middle both are stopped and two fresh processes (nothing of the chain in
    memory) take over. Every turn continues the one before it from Redis: served,
    within the budget, counted as the engine counts, and one session throughout."""

    def replica() -> ProxyProcess:
        return start_vllm_proxy(
            max_prompt_tokens=BUDGET, redis_url=redis_server.url, session_max_turns=50
        )

    proxies = [replica(), replica()]
    previous = None
    forwarded, sessions = [], set()
    for n in range(TURNS):
        if n == TURNS // 2:
            for proxy in proxies:
                proxy.stop()
            proxies = [replica(), replica()]
        proxy = proxies[n % 2]
        client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused", timeout=120))
        t = turn(client, n, previous, stream=n % 2 == 1, model="tiny-chat")
        assert t.forwarded <= BUDGET
        assert t.response["usage"]["input_tokens"] == t.forwarded  # the count is the engine's
        forwarded.append(t.forwarded)
        sessions.add(t.session)
        previous = t.response["id"]
    print(f"\nforwarded prompt tokens per turn (two replicas, restarted at turn 11): {forwarded}")
    # The first turn after the restart got the history stored before it.
    assert forwarded[TURNS // 2] > forwarded[0]
    assert len(sessions) == 1 and None not in sessions  # one session on every replica
    reader = closing(openai.OpenAI(base_url=proxies[0].api_base, api_key="unused"))
    assert previous is not None and reader.responses.retrieve(previous).id == previous
