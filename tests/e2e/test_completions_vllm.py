"""``/v1/completions`` and ``/v1/messages/count_tokens`` in front of a real vLLM engine:
the proxy's count of a raw prompt is the engine's ``usage.prompt_tokens`` (a string, a
list of strings, token ids; with the ``hf:`` counter and the ``upstream`` one), a
prompt over the budget is refused before it reaches the engine, and the proxy's
``count_tokens`` answer is the engine's own."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import StartVllmProxy
from tests.support.closing import Closing
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

PROMPTS: list[Any] = [
    "The river runs past the old mill, and the mountain road where people walk.",
    ["Once upon a time", "a small train carries coffee, bread and apples to the city"],
    [17, 42, 99, 7, 256, 1000],
    [[5, 6, 7], [8, 9, 10, 11, 12]],
]


@pytest.mark.parametrize("tokenizer", ["hf", "upstream"])
def test_the_count_of_a_raw_prompt_is_the_engines(
    closing: Closing, tokenizer: str, start_vllm_proxy: StartVllmProxy, vllm_idle: VllmStack
) -> None:
    settings: dict[str, Any] = {"max_prompt_tokens": 1000}
    if tokenizer == "upstream":
        settings["tokenizer"] = "upstream"
    proxy = start_vllm_proxy(**settings)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="x", max_retries=0))
    for prompt in PROMPTS:
        for extra in ({}, {"add_special_tokens": False}):
            raw = client.completions.with_raw_response.create(
                model=vllm_idle.served_name, prompt=prompt, max_tokens=2, extra_body=extra
            )
            usage = raw.parse().usage
            assert usage is not None
            counted = int(raw.headers["x-trimproxy-prompt-tokens"])
            assert counted == usage.prompt_tokens, (prompt, extra)


def test_a_raw_prompt_over_the_budget_never_reaches_the_engine(
    closing: Closing, start_vllm_proxy: StartVllmProxy, vllm_idle: VllmStack
) -> None:
    proxy = start_vllm_proxy(max_prompt_tokens=100, max_completion_tokens=8)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="x", max_retries=0))
    before = vllm_idle.metrics().value("vllm:prompt_tokens_total")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=vllm_idle.served_name, prompt="the old mill " * 200, max_tokens=4
        )
    assert info.value.code == "context_length_exceeded"
    assert vllm_idle.metrics().value("vllm:prompt_tokens_total") == before
    capped = client.completions.with_raw_response.create(
        model=vllm_idle.served_name, prompt="the old mill", max_tokens=500
    )
    assert capped.headers["x-trimproxy-max-tokens-capped"] == "500"
    assert capped.parse().usage.completion_tokens <= 8  # type: ignore[union-attr]


@pytest.mark.parametrize("tokenizer", ["hf", "upstream"])
def test_count_tokens_is_the_engines(
    closing: Closing, tokenizer: str, start_vllm_proxy: StartVllmProxy, vllm_idle: VllmStack
) -> None:
    settings: dict[str, Any] = {}
    if tokenizer == "upstream":
        settings["tokenizer"] = "upstream"
    proxy = start_vllm_proxy(**settings)
    body: dict[str, Any] = {
        "model": vllm_idle.served_name,
        "system": "You are a terse assistant taking part in a test.",
        "tools": [
            {
                "name": "get_weather",
                "description": "The weather of a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        # The test engine has no tool parser: it refuses "auto" and a named tool, and
        # renders the tools with "none" (vLLM's --exclude-tools-when-tool-choice-none off).
        "tool_choice": {"type": "none"},
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Sunny, 21 degrees."}]},
            {"role": "user", "content": [{"type": "text", "text": "And in Rome tomorrow?"}]},
        ],
    }
    client = closing(anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0))
    for sent in (body, {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}):
        counted = client.messages.count_tokens(**sent)
        engine = httpx.post(
            f"{vllm_idle.base_url}/v1/messages/count_tokens",
            json=sent,
            headers=vllm_idle.headers(),
            timeout=60.0,
        )
        assert engine.status_code == 200, engine.text
        assert counted.input_tokens == engine.json()["input_tokens"]
