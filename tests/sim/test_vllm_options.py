"""The demo upstream answers the options users try first the way vLLM does (its
``chat_completion/protocol.py`` checks and ``serving.py`` shapes): ``n``,
``logprobs``, ``response_format``, ``tool_choice`` and ``max_tokens`` on streamed
completions. The official SDK parses each answer. (``/v1/responses``:
``test_responses.py``.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.sim import SimUpstream

StartSim = Callable[..., SimUpstream]
HELLO = [{"role": "user", "content": "hello"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city", "unit", "days"],
        },
    },
}


@pytest.fixture
def sim(sim_upstream_factory: StartSim) -> SimUpstream:
    return sim_upstream_factory(completion_tokens=5)


def post(sim: SimUpstream, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{sim.url}{path}", json={"model": "sim-model", **body}, timeout=10)


def sse(response: httpx.Response) -> list[Any]:
    assert response.status_code == 200, response.text
    out: list[Any] = []
    for event in response.text.split("\n\n"):
        for line in event.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(orjson.loads(line[len("data: ") :]))
    assert response.text.rstrip().endswith("data: [DONE]") or out[-1]["type"].startswith(
        "response."
    )
    return out


def openai_client(sim: SimUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)


def test_n_gives_n_choices(sim: SimUpstream) -> None:
    body = post(sim, "/v1/chat/completions", {"messages": HELLO, "n": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 3 * 5
    chunks = sse(post(sim, "/v1/chat/completions", {"messages": HELLO, "n": 2, "stream": True}))
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert len(mine) == 1 + 5 and mine[-1]["finish_reason"] == "stop"
    with openai_client(sim) as client:
        done = client.chat.completions.create(model="sim-model", messages=HELLO, n=2)  # type: ignore[arg-type]
        assert len(done.choices) == 2


def test_logprobs_in_vllms_shape(sim: SimUpstream) -> None:
    body = {"messages": HELLO, "logprobs": True, "top_logprobs": 2}
    choice = post(sim, "/v1/chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 5
    text = "".join(entry["token"] for entry in content)
    assert text.lstrip() == choice["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] < 0 and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]
    plain = post(sim, "/v1/chat/completions", {"messages": HELLO, "logprobs": True}).json()
    assert all(e["top_logprobs"] == [] for e in plain["choices"][0]["logprobs"]["content"])
    streamed = sse(post(sim, "/v1/chat/completions", {**body, "stream": True}))
    assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in streamed[1:]) == 5
    with openai_client(sim) as client:
        done = client.chat.completions.create(
            model="sim-model",
            messages=HELLO,  # type: ignore[arg-type]
            logprobs=True,
            top_logprobs=2,
        )
        assert done.choices[0].logprobs is not None
        assert done.choices[0].logprobs.content is not None
        assert len(done.choices[0].logprobs.content) == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true."),
        ({"logprobs": True, "top_logprobs": 21}, "greater than max allowed: 20"),
        ({"tools": [WEATHER]}, '"auto" tool choice requires --enable-auto-tool-choice'),
        ({"tools": [WEATHER], "tool_choice": "auto"}, '"auto" tool choice requires'),
        ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set."),
        ({"tools": []}, "`tools` must not be an empty array."),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "does not match any of the specified `tools`",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
    ],
)
def test_what_vllm_refuses_is_refused_with_its_words(
    sim: SimUpstream, body: dict[str, Any], message: str
) -> None:
    r = post(sim, "/v1/chat/completions", {"messages": HELLO, **body})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "BadRequestError"


def test_response_format_gives_json(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(completion_tokens=12)
    as_object = {"messages": HELLO, "response_format": {"type": "json_object"}}
    obj = post(sim, "/v1/chat/completions", as_object)
    assert isinstance(orjson.loads(obj.json()["choices"][0]["message"]["content"]), dict)
    schema = WEATHER["function"]["parameters"]  # type: ignore[index]
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    done = post(sim, "/v1/chat/completions", {"messages": HELLO, "response_format": fmt})
    value = orjson.loads(done.json()["choices"][0]["message"]["content"])
    assert value == {"city": "sim", "unit": "celsius", "days": 1}
    chunks = sse(post(sim, "/v1/chat/completions", {"messages": HELLO, "response_format": fmt,
                                                     "stream": True}))  # fmt: skip
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert orjson.loads(text) == value
    assert len(chunks) == 1 + 12


def test_a_named_tool_choice_calls_that_tool(sim: SimUpstream) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = {"messages": HELLO, "tools": [WEATHER], "tool_choice": choice}
    answer = post(sim, "/v1/chat/completions", body).json()["choices"][0]
    (call,) = answer["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == {
        "city": "sim",
        "unit": "celsius",
        "days": 1,
    }
    assert answer["message"]["content"] == "" and answer["finish_reason"] == "stop"
    chunks = sse(post(sim, "/v1/chat/completions", {**body, "stream": True}))
    deltas = [c["choices"][0]["delta"].get("tool_calls") for c in chunks[1:]]
    assert deltas[0][0]["function"]["name"] == "get_weather"
    arguments = "".join(d[0]["function"]["arguments"] for d in deltas)
    assert orjson.loads(arguments) == orjson.loads(call["function"]["arguments"])
    required = post(sim, "/v1/chat/completions", {**body, "tool_choice": "required"}).json()
    assert required["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    none = post(sim, "/v1/chat/completions", {**body, "tool_choice": "none"}).json()
    assert (
        none["choices"][0]["message"]["content"] and not none["choices"][0]["message"]["tool_calls"]
    )
    with openai_client(sim) as client:
        done = client.chat.completions.create(  # type: ignore[call-overload]
            model="sim-model", messages=HELLO, tools=[WEATHER], tool_choice=choice
        )
        assert done.choices[0].message.tool_calls


def test_completions_respect_max_tokens_when_streamed(sim_upstream_factory: StartSim) -> None:
    sim = sim_upstream_factory(completion_tokens=48)
    chunks = sse(post(sim, "/v1/completions", {"prompt": "Once", "max_tokens": 4,
                                                "stream": True}))  # fmt: skip
    assert len(chunks) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    done = post(sim, "/v1/completions", {"prompt": "Once", "max_tokens": 4}).json()
    assert done["usage"]["completion_tokens"] == 4
    default = post(sim, "/v1/completions", {"prompt": "Once"}).json()
    assert default["usage"]["completion_tokens"] == 16  # vLLM's default max_tokens
