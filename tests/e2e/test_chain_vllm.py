"""A ``previous_response_id`` chain of 20 turns against the real vLLM engine, started
without its response store (its default), through trimproxy: each request sends only
its new input, trimproxy expands the chain from its own store and trims it to the
budget; every turn is served, and the engine's ``usage.input_tokens`` is trimproxy's
count."""

from __future__ import annotations

import openai
import pytest

from tests.chains.helpers import turn
from tests.e2e.conftest import StartVllmProxy
from tests.support.closing import Closing

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
