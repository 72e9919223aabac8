"""The sim's ``POST /v1/responses`` as vLLM 0.32 serves it with its response store off
(``proxy/sim/responses.py``), driven over HTTP by the official ``openai`` SDK: the
body, the event stream, the chat conversion of a tool-using input (counted as the
sim's ``/tokenize`` counts the same chat), the prefix cache, and the errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.sim import SimUpstream

StartSim = Callable[..., SimUpstream]
MODEL = "sim-model"
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


@pytest.fixture
def sim(sim_upstream_factory: StartSim) -> SimUpstream:
    return sim_upstream_factory(completion_tokens=5)


def client(sim: SimUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)


def tokenize(sim: SimUpstream, messages: list[dict[str, Any]]) -> int:
    answer = httpx.post(f"{sim.url}/tokenize", json={"model": MODEL, "messages": messages})
    count: int = answer.json()["count"]
    return count


def post(sim: SimUpstream, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{sim.url}/v1/responses", json={"model": MODEL, **body}, timeout=10)


def test_answer_counts_instructions_and_input(sim: SimUpstream) -> None:
    with client(sim) as c:
        done = c.responses.create(model=MODEL, input="hello", instructions="Be brief.",
                                  max_output_tokens=3)  # fmt: skip
        full = c.responses.create(model=MODEL, input="hello", store=True)  # silently unstored
    assert done.id.startswith("resp_") and done.object == "response"
    assert done.status == "incomplete" and done.incomplete_details is not None
    assert done.incomplete_details.reason == "max_output_tokens"
    (item,) = done.output
    assert item.type == "message" and item.id.startswith("msg_") and item.status == "completed"
    assert done.output_text == "Hello from the"
    expected = tokenize(sim, [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "hello"}])  # fmt: skip
    assert done.usage is not None and done.usage.input_tokens == expected
    assert done.usage.output_tokens == 3 and done.usage.total_tokens == expected + 3
    assert done.usage.output_tokens_details.reasoning_tokens == 0
    assert done.max_output_tokens == 3 and done.tool_choice == "none"
    assert full.status == "completed" and full.incomplete_details is None
    assert full.max_output_tokens == 4096 - tokenize(sim, [{"role": "user", "content": "hello"}])
    assert sim.requests("/v1/responses")[-1]["prompt_tokens"] == full.usage.input_tokens  # type: ignore[union-attr]


STREAM = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.content_part.added", *["response.output_text.delta"] * 5,
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.completed",
]  # fmt: skip


def test_stream_is_vllms_event_sequence(sim: SimUpstream) -> None:
    with client(sim) as c:
        events = list(c.responses.create(model=MODEL, input="hello", stream=True))
    assert [e.type for e in events] == STREAM
    assert [e.sequence_number for e in events] == list(range(len(STREAM)))
    added, completed = events[2], events[-1]
    assert added.type == "response.output_item.added"
    assert completed.type == "response.completed"
    response = completed.response
    assert response.id == events[0].response.id  # type: ignore[union-attr]
    assert response.output[0].id == added.item.id
    assert response.output_text == "".join(getattr(e, "delta", "") for e in events)
    assert response.usage is not None and response.usage.output_tokens == 5
    # Cut short, the last event is still response.completed, its status incomplete.
    raw = post(sim, {"input": "hello", "stream": True, "max_output_tokens": 2})
    blocks = [b for b in raw.text.split("\n\n") if b]
    assert all(b.startswith("event: ") and "\ndata: {" in b for b in blocks)
    assert blocks[-1].startswith("event: response.completed\n")
    assert '"status":"incomplete"' in blocks[-1]


def test_an_incomplete_assistant_item_is_continued(sim: SimUpstream) -> None:
    """vLLM's ``should_continue_final_message``: a final assistant item with status
    ``incomplete`` is continued (no generation prompt), from where its text ends."""
    partial = {
        "type": "message",
        "role": "assistant",
        "id": "msg_a",
        "status": "incomplete",
        "content": [{"type": "output_text", "text": "Hello from", "annotations": []}],
    }
    user = {"role": "user", "content": "hello"}
    open_: Any = [user, partial]
    closed_: Any = [user, {**partial, "status": "completed"}]
    with client(sim) as c:
        done = c.responses.create(model=MODEL, input=open_)
        closed = c.responses.create(model=MODEL, input=closed_)
    assert done.output_text == " the simulated upstream" and done.status == "completed"
    assert done.usage is not None and done.usage.output_tokens == 3
    # The same conversation rendered open-ended: the prompt lacks the generation prompt.
    assert done.usage.input_tokens < tokenize(
        sim, [user, {"role": "assistant", "content": "Hello from"}]
    )
    assert closed.output_text == "Hello from the simulated upstream"  # a new answer


def test_tool_conversation_is_counted_as_vllm_converts_it(sim: SimUpstream) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris"}'}  # fmt: skip
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "Ask the tool."}]},
        call,
        {**call, "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "Still sunny"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is sunny."}]},
        {"role": "user", "content": "Thanks!"},
    ]  # fmt: skip
    with client(sim) as c:
        done = c.responses.create(model=MODEL, input=items, tools=[TOOL],  # type: ignore[list-item]
                                  instructions="Use tools.")  # fmt: skip
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    tool_call = {"id": "call_1", "function": function, "type": "function"}
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "reasoning": "Ask the tool.",
         "tool_calls": [tool_call, {**tool_call, "id": "call_2"}]},
        {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Still sunny", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks!"},
    ]  # fmt: skip
    assert done.usage is not None and done.usage.input_tokens == tokenize(sim, chat)
    assert done.tool_choice == "auto" and [t.name for t in done.tools] == ["get_weather"]  # type: ignore[union-attr]
    assert done.output[0].type == "message"  # no tool parser: a text answer


def test_prompts_go_through_the_prefix_cache(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(completion_tokens=5, block_size=4)
    long = "The same long question, asked twice. " * 20
    with client(sim) as c:
        first = c.responses.create(model=MODEL, input=long)
        hits = sim.state()["prefix_cache_hits_total"]
        second = c.responses.create(model=MODEL, input=long)
    assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0 and cached % 4 == 0 and cached < second.usage.input_tokens
    assert sim.state()["prefix_cache_hits_total"] == hits + cached
    assert sim.requests("/v1/responses")[-1]["cached_tokens"] == cached


def error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


def test_errors_are_vllms(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(max_model_len=64)
    missing = post(sim, {"input": "hi", "previous_response_id": "resp_gone"})
    assert missing.status_code == 404
    assert error(missing) == {"message": "Response with id 'resp_gone' not found.",
                              "type": "invalid_request_error", "param": "response_id",
                              "code": 404}  # fmt: skip
    background = post(sim, {"input": "hi", "background": True})
    assert background.status_code == 400 and error(background)["param"] == "background"
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in error(background)["message"]
    long = post(sim, {"input": "word " * 100})
    assert long.status_code == 400
    prompt = tokenize(sim, [{"role": "user", "content": "word " * 100}])
    assert error(long) == {
        "message": f"This model's maximum context length is 64 tokens. However, your prompt "
        f"contains {prompt} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        f"value={prompt})",
        "type": "BadRequestError", "param": "input_tokens", "code": 400,
    }  # fmt: skip
    too_many = post(sim, {"input": "hi", "max_output_tokens": 65})
    assert error(too_many)["param"] == "max_output_tokens"
    secret = post(sim, {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]})
    assert error(secret)["message"] == "Encrypted content is not supported. (parameter=input)"
    with client(sim) as c, pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_gone")
    assert httpx.get(f"{sim.url}/v1/responses/resp_gone").status_code == 404
    assert httpx.delete(f"{sim.url}/v1/responses/resp_gone").status_code == 405


def test_fastchat_serves_neither_route(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory("fastchat")
    for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        answer = httpx.post(f"{sim.url}{path}", json={"model": MODEL, "input": "hi"})
        assert answer.status_code == 404 and answer.json() == {"detail": "Not Found"}
