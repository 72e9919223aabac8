"""``/v1/completions``, ``/v1/messages/count_tokens`` and the blind routes through a
real ``trimproxy serve`` in front of the simulated vLLM engine, driven by the official
``openai`` and ``anthropic`` SDKs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

StartProxy = Callable[..., ProxyProcess]
PATHS = ("/v1/completions", "/v1/messages/count_tokens", "/v1/responses", "/v1/messages")
BUDGET = 200
CAP = 12
PROMPT = "Once upon a time, " * 6
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture
def proxy(proxy_server: StartProxy) -> ProxyProcess:
    return proxy_server(
        tokenizer="upstream",
        max_prompt_tokens=BUDGET,
        max_completion_tokens=CAP,
        upstream_metrics_interval=0,
    )


def completions_client(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)


def test_the_count_is_the_engines_usage(
    closing: Closing, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    client = closing(completions_client(proxy))
    for prompt in (PROMPT, [PROMPT, "a short one"], [5, 6, 7, 8], [[1, 2], [3, 4, 5]]):
        raw = client.completions.with_raw_response.create(
            model="sim-model", prompt=prompt, max_tokens=4
        )
        answer = raw.parse()
        assert answer.usage is not None
        assert int(raw.headers["x-trimproxy-prompt-tokens"]) == answer.usage.prompt_tokens
        assert raw.headers["x-trimproxy-trimmed-messages"] == "0"
    received = sim_upstream.requests("/v1/completions")
    assert [r["json"]["prompt"] for r in received][1] == [PROMPT, "a short one"]
    assert all(r["json"]["max_tokens"] == 4 for r in received)  # within the cap: as sent


def test_max_tokens_is_capped_and_a_missing_one_is_the_engines_16(
    closing: Closing, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    client = closing(completions_client(proxy))
    raw = client.completions.with_raw_response.create(
        model="sim-model", prompt=PROMPT, max_tokens=500
    )
    assert raw.headers["x-trimproxy-max-tokens-capped"] == "500"
    assert raw.parse().usage.completion_tokens <= CAP  # type: ignore[union-attr]
    default = client.completions.with_raw_response.create(model="sim-model", prompt=PROMPT)
    assert default.headers["x-trimproxy-max-tokens-capped"] == "16"
    sent = [r["json"]["max_tokens"] for r in sim_upstream.requests("/v1/completions")]
    assert sent == [CAP, CAP]


def test_over_the_budget_is_refused_never_forwarded(
    closing: Closing, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    client = closing(completions_client(proxy))
    long = "lorem ipsum dolor sit amet " * 60
    for prompt in (long, ["short", long]):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="sim-model", prompt=prompt, max_tokens=4)
        assert info.value.code == "context_length_exceeded"
        assert "raw prompt has no turns to drop" in info.value.message
    assert sim_upstream.requests("/v1/completions") == []
    # Each prompt is its own sequence: two that fit alone pass, though their sum does not.
    half = "lorem ipsum dolor sit amet " * 5
    both = client.completions.with_raw_response.create(
        model="sim-model", prompt=[half] * 8, max_tokens=4
    )
    assert int(both.headers["x-trimproxy-prompt-tokens"]) > BUDGET


def test_streamed_and_observed_in_the_metrics(
    closing: Closing, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    client = closing(completions_client(proxy))
    chunks = list(
        client.completions.create(model="sim-model", prompt=PROMPT, max_tokens=4, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    text = httpx.get(f"{proxy.url}/metrics").text
    received = (
        'trimproxy_prompt_tokens_count{endpoint="completions",model="sim-model",stage="received"}'
    )
    assert f"{received} 1.0" in text


def test_other_methods_and_spellings_are_not_relayed(
    proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    for path in PATHS:
        answer = httpx.get(f"{proxy.url}{path}")
        assert answer.status_code == 405 and answer.headers["allow"] == "POST", path
    body = {"model": "sim-model", "prompt": "lorem " * 500}
    answer = httpx.post(f"{proxy.url}/v1/Completions", json=body)
    assert answer.status_code == 404
    assert "/v1/completions" in answer.json()["error"]["message"]
    # The proxy's own calls (the counter's /tokenize, the model list) aside: nothing.
    relayed = [r["path"] for r in sim_upstream.requests() if r["path"].lower() in PATHS]
    assert relayed == []


def anthropic_client(proxy: ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)


def test_count_tokens_agrees_with_the_engine(
    closing: Closing, proxy: ProxyProcess, sim_upstream: SimUpstream
) -> None:
    call = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "sun"}
    body: dict[str, Any] = {
        "model": "sim-model",
        "system": "You are terse.",
        "tools": TOOLS,
        # named: a vLLM started without --enable-auto-tool-choice refuses "auto"
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ],
    }
    counted = closing(anthropic_client(proxy)).messages.count_tokens(**body)
    assert sim_upstream.requests("/v1/messages/count_tokens") == []  # answered by the proxy
    engine = httpx.post(f"{sim_upstream.url}/v1/messages/count_tokens", json=body).json()
    assert counted.input_tokens == engine["input_tokens"] > 0
    without = closing(anthropic_client(proxy)).messages.count_tokens(
        model="sim-model", messages=body["messages"][:1]
    )
    assert without.input_tokens < counted.input_tokens


def test_count_tokens_errors_are_anthropics(closing: Closing, proxy: ProxyProcess) -> None:
    client = closing(anthropic_client(proxy))
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.count_tokens(model="sim-model", messages=[])
    body: Any = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'messages' must be a non-empty list" in body["error"]["message"]
    answer = httpx.post(
        f"{proxy.url}/v1/messages/count_tokens",
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "type": "invalid_request_error",
        "message": "'model' is required.",
    }


def test_blind_routes_are_relayed_or_refused(
    closing: Closing, proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    body = {"model": "sim-model", "input": "hello"}
    relayed = proxy_server(upstream_metrics_interval=0)
    assert httpx.post(f"{relayed.url}/v1/embeddings", json=body).status_code == 200
    refusing = proxy_server(blind_routes="refuse", upstream_metrics_interval=0)
    sim_upstream.clear()
    answer = httpx.post(f"{refusing.url}/v1/embeddings", json=body)
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "not_found" and "TRIMPROXY_BLIND_ROUTES" in error["message"]
    assert httpx.post(f"{refusing.url}/tokenize", json={"prompt": "a"}).status_code == 404
    assert sim_upstream.requests() == []
    # What it bounds, and the model list, it still serves.
    assert httpx.get(f"{refusing.url}/v1/models").status_code == 200
    client = closing(completions_client(refusing))
    assert client.completions.create(model="sim-model", prompt="hi", max_tokens=2).choices
