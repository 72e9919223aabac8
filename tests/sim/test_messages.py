"""The sim's Anthropic Messages API as vLLM 0.32 serves it (``proxy/sim/messages.py``),
driven over HTTP by the official ``anthropic`` SDK: the message, the event stream, a
tool conversation counted as the sim's ``/tokenize`` counts vLLM's chat conversion of
it, ``count_tokens``, the prefix cache, the errors' envelopes and the API key."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.sim import SimUpstream

StartSim = Callable[..., SimUpstream]
MODEL = "sim-model"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
TOOL: Any = {"name": "get_weather", "description": "The weather in a city.",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}  # fmt: skip


@pytest.fixture
def sim(sim_upstream_factory: StartSim) -> SimUpstream:
    return sim_upstream_factory(completion_tokens=5)


def client(sim: SimUpstream, **auth: Any) -> anthropic.Anthropic:
    auth = auth or {"api_key": "x"}
    return anthropic.Anthropic(base_url=sim.url, max_retries=0, **auth)


def tokenize(sim: SimUpstream, messages: list[dict[str, Any]]) -> int:
    answer = httpx.post(f"{sim.url}/tokenize", json={"model": MODEL, "messages": messages})
    count: int = answer.json()["count"]
    return count


def post(sim: SimUpstream, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{sim.url}{path}", json={"model": MODEL, **body}, timeout=10)


def test_message_counts_system_and_messages(sim: SimUpstream) -> None:
    system: Any = [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                   {"type": "text", "text": "Be brief."}]  # fmt: skip
    with client(sim) as c:
        done = c.messages.create(model=MODEL, max_tokens=100, system=system, messages=HELLO)
        short = c.messages.create(model=MODEL, max_tokens=3, messages=HELLO)
    assert done.id.startswith("chatcmpl-")  # vLLM's message id is its chat completion's
    assert done.type == "message" and done.role == "assistant" and done.model == MODEL
    assert [b.type for b in done.content] == ["text"]
    assert done.content[0].text == "Hello from the simulated upstream"  # type: ignore[union-attr]
    assert done.stop_reason == "end_turn" and done.stop_sequence is None
    expected = tokenize(sim, [{"role": "system", "content": "Be brief."}, *HELLO])
    assert done.usage.input_tokens == expected and done.usage.output_tokens == 5
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    raw = post(sim, "/v1/messages", {"max_tokens": 100, "messages": HELLO}).json()
    assert "stop_sequence" not in raw  # vLLM drops the nulls of a whole answer
    assert raw["usage"] == {"input_tokens": tokenize(sim, HELLO), "output_tokens": 5}
    assert sim.requests("/v1/messages")[-1]["prompt_tokens"] == tokenize(sim, HELLO)


def events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    assert response.status_code == 200, response.text
    out = []
    for block in (b for b in response.text.split("\n\n") if b):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == name[len("event: ") :]
        out.append((payload["type"], payload))
    return out


def test_stream_is_vllms_event_sequence(sim: SimUpstream) -> None:
    raw = events(post(sim, "/v1/messages", {"max_tokens": 100, "messages": HELLO,
                                            "stream": True}))  # fmt: skip
    names = [name for name, _ in raw]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 5,
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start = raw[0][1]["message"]
    assert start["usage"] == {"input_tokens": tokenize(sim, HELLO), "output_tokens": 0}
    assert start["content"] == [] and start["stop_reason"] is None
    assert raw[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert raw[-2][1]["usage"]["output_tokens"] == 5
    with client(sim) as c, c.messages.stream(model=MODEL, max_tokens=2, messages=HELLO) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello from" and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 2


CONVERSATION: list[Any] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Ask the tool.", "signature": "s"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "21 C"}]},
        {"type": "text", "text": "Thanks!"},
    ]},
]  # fmt: skip


def test_tool_conversation_is_counted_as_vllm_converts_it(sim: SimUpstream) -> None:
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning": "Ask the tool.", "content": "Let me check.",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny\n21 C"},
        {"role": "user", "content": "Thanks!"},
    ]  # fmt: skip
    expected = tokenize(sim, chat)
    with client(sim) as c:
        done = c.messages.create(model=MODEL, max_tokens=50, system="Use tools.",
                                 messages=CONVERSATION, tools=[TOOL],
                                 tool_choice={"type": "none"})  # fmt: skip
        counted = c.messages.count_tokens(model=MODEL, system="Use tools.",
                                          messages=CONVERSATION)  # fmt: skip
        called = c.messages.create(model=MODEL, max_tokens=50, messages=HELLO, tools=[TOOL],
                                   tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    assert done.usage.input_tokens == expected == counted.input_tokens
    (use,) = called.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "sim"}
    assert called.stop_reason == "tool_use"
    streamed = events(post(sim, "/v1/messages", {
        "max_tokens": 50, "messages": HELLO, "stream": True, "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather"}}))  # fmt: skip
    assert streamed[1][1]["content_block"]["type"] == "tool_use"
    parts = [p["delta"]["partial_json"] for name, p in streamed if name == "content_block_delta"]
    assert json.loads("".join(parts)) == {"city": "sim"}
    assert streamed[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_prompts_go_through_the_prefix_cache(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(completion_tokens=5, block_size=4)
    long: Any = [{"role": "user", "content": "The same long question, asked twice. " * 20}]
    with client(sim) as c:
        c.messages.create(model=MODEL, max_tokens=10, messages=long)
        before = sim.state()["prefix_cache_hits_total"]
        c.messages.create(model=MODEL, max_tokens=10, messages=long)
    cached = sim.requests("/v1/messages")[-1]["cached_tokens"]
    assert cached > 0 and sim.state()["prefix_cache_hits_total"] == before + cached


def anthropic_error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    error: dict[str, Any] = body["error"]
    return error


def test_errors_are_vllms(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(max_model_len=64, strict_model=True)
    words = [{"role": "user", "content": "word " * 100}]
    long = post(sim, "/v1/messages", {"max_tokens": 10, "messages": words})
    prompt = tokenize(sim, words)
    assert long.status_code == 400
    assert anthropic_error(long) == {
        "type": "BadRequestError",
        "message": f"This model's maximum context length is 64 tokens. However, your prompt "
        f"contains {prompt} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        f"value={prompt})",
    }  # fmt: skip
    counted = post(sim, "/v1/messages/count_tokens", {"messages": words})
    assert counted.status_code == 400 and anthropic_error(counted)["type"] == "BadRequestError"
    wide = post(sim, "/v1/messages", {"max_tokens": 100, "messages": HELLO})
    assert anthropic_error(wide)["message"].startswith(
        "max_completion_tokens=100 cannot be greater than max_model_len=64."
    )
    auto = post(sim, "/v1/messages", {"max_tokens": 10, "messages": HELLO, "tools": [TOOL]})
    assert auto.status_code == 400 and "--enable-auto-tool-choice" in anthropic_error(auto)[
        "message"]  # fmt: skip
    other = post(sim, "/v1/messages", {"max_tokens": 10, "messages": HELLO, "model": "other"})
    assert other.status_code == 404
    assert anthropic_error(other) == {"type": "NotFoundError",
                                      "message": "The model `other` does not exist."}  # fmt: skip
    # The request model's own refusals are FastAPI's, in vLLM's OpenAI envelope.
    unbounded = post(sim, "/v1/messages", {"messages": HELLO})
    assert unbounded.status_code == 400 and unbounded.json()["error"]["type"] == "Bad Request"
    with client(sim) as c, pytest.raises(anthropic.BadRequestError):
        c.messages.create(model=MODEL, max_tokens=10, messages=HELLO, tools=[TOOL])


def test_api_key_is_a_bearer_token_only(sim_upstream_factory: StartSim) -> None:
    # vLLM's --api-key checks Authorization: Bearer and nothing else: Anthropic's own
    # x-api-key header alone is refused (this SDK sends the key as a bearer token).
    sim = sim_upstream_factory(api_key="secret")
    body = {"model": MODEL, "max_tokens": 10, "messages": HELLO}
    keyed = httpx.post(f"{sim.url}/v1/messages", json=body, headers={"x-api-key": "secret"})
    assert keyed.status_code == 401 and keyed.json() == {"error": "Unauthorized"}
    with client(sim, api_key="secret") as c:
        assert c.messages.create(model=MODEL, max_tokens=10, messages=HELLO).usage.output_tokens
    with client(sim, api_key="wrong") as c, pytest.raises(anthropic.AuthenticationError):
        c.messages.count_tokens(model=MODEL, messages=HELLO)
