"""``previous_response_id`` through a real ``trimproxy serve`` in front of the simulated
engine (whose store is off, as vLLM's is by default), driven by the official ``openai``
SDK: each turn sends only its new input; trimproxy expands the chain from its own
store, trims it to the budget, and forwards ``store: false`` without the previous id.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.chains.helpers import INSTRUCTIONS, Turn, sent_bodies, texts, turn, words
from tests.conftest import StartProxy
from tests.sessions.helpers import metric_value
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

BUDGET = 300
TURNS = 20
KEY = {"authorization": "Bearer unused"}  # the SDK's key: stored responses are per key


def start(proxy_server: StartProxy, **extra: object) -> ProxyProcess:
    return proxy_server(
        tokenizer="upstream", max_prompt_tokens=BUDGET, upstream_metrics_interval=0, **extra
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_20_turn_chain_stays_within_the_budget(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream, stream: bool
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused"))
    turns: list[Turn] = []
    previous = None
    for n in range(TURNS):
        t = turn(client, n, previous, stream=stream)
        assert t.forwarded <= BUDGET
        assert t.response["usage"]["input_tokens"] == t.forwarded  # the count is the engine's
        turns.append(t)
        previous = t.response["id"]
    bodies = sent_bodies(sim_upstream)
    assert len(bodies) == TURNS
    assert all(b["store"] is False and "previous_response_id" not in b for b in bodies)
    assert all(b["instructions"] == INSTRUCTIONS for b in bodies)
    # Turn 2 got turn 1's input and answer in front of its own: the chain, expanded.
    answer1 = texts(turns[0].response["output"])[0]
    assert texts(bodies[1]["input"]) == [words(0), answer1, words(1)]
    # The last turn: trimmed to whole turns, its own input last.
    last = bodies[-1]["input"]
    assert last[0]["role"] == "user" and texts(last)[-1] == words(TURNS - 1)
    assert len(last) < 2 * TURNS - 1
    # The engine stored nothing; what the client reads back is what it got.
    for t in (turns[0], turns[-1]):
        as_sdk = Response.model_validate(t.response).model_dump(mode="json")
        assert client.responses.retrieve(t.response["id"]).model_dump(mode="json") == as_sdk
        got = httpx.get(f"{proxy.api_base}/responses/{t.response['id']}", headers=KEY, timeout=10)
        assert got.status_code == 200
        assert got.json() == t.response if not stream else got.json()["id"] == t.response["id"]


def test_get_delete_and_unknown_ids(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused"))
    first = turn(client, 0, None, stream=False).response["id"]
    deleted = httpx.delete(f"{proxy.api_base}/responses/{first}", headers=KEY, timeout=10)
    assert deleted.status_code == 200
    assert deleted.json() == {"id": first, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(first)
    assert missing.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first)
    sim_upstream.clear()
    with pytest.raises(openai.BadRequestError) as unknown:
        turn(client, 1, "resp_unknown", stream=False)
    assert unknown.value.code == "previous_response_not_found"
    assert unknown.value.param == "previous_response_id"
    assert sim_upstream.requests("/v1/responses") == []  # never forwarded
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    lookups = "trimproxy_response_store_lookups_total"
    assert metric_value(text, lookups, outcome="hit") == 1  # the delete
    assert metric_value(text, lookups, outcome="miss") == 3  # retrieve, delete, previous
    assert metric_value(text, "trimproxy_response_store_entries") == 0


def test_store_false_is_not_kept_and_another_key_sees_nothing(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a"))
    unstored = client.responses.create(model="sim-model", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stored = client.responses.create(model="sim-model", input="hi")
    assert client.responses.retrieve(stored.id).id == stored.id
    other = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-b"))
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(stored.id)
    # A string input is kept as the user message it stands for.
    follow = client.responses.create(
        model="sim-model", input="more", previous_response_id=stored.id
    )
    assert follow.status == "completed"
    body = sent_bodies(sim_upstream)[-1]
    assert texts(body["input"]) == ["hi", stored.output_text, "more"]


def test_a_chain_is_one_session(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    proxy = start(proxy_server, session_max_turns=3, session_limit_action="reject")
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="unused"))
    sessions = []
    previous = None
    for n in range(3):
        t = turn(client, n, previous, stream=False)
        sessions.append(t.session)
        previous = t.response["id"]
    assert sessions[0] is not None and len(set(sessions)) == 1
    other = turn(client, 0, None, stream=False, tag="b")
    assert other.session not in sessions  # another chain, another session
    with pytest.raises(openai.ConflictError) as limit:
        turn(client, 3, previous, stream=False)
    assert limit.value.code == "session_turn_limit"
