"""The official SDKs' calls the dialect tests against the real vLLM engine make: one
turn of a conversation by chat, Responses (streamed or not) or Messages (``create`` or
``stream``), each giving the proxy's count and trim headers beside the engine's own
count of the prompt (``tests/e2e/test_dialects_vllm.py``, ``test_agent_vllm.py``)."""

from __future__ import annotations

import random
import threading
from typing import Any

import anthropic
import httpx
import openai

from tests.sessions.helpers import metric_value
from tests.support.tiny_model import MODEL_NAME

#: Each answer's length: the tests are about prompts.
MAX_TOKENS = 16

# Prose reads better than a list literal here.
_WORDS = (  # noqa: SIM905
    "the river runs past the old mill and the mountain road where people walk in the "
    "morning light while a small train carries coffee bread and apples to the city team "
    "project plan needs a clear answer about the token budget the model server memory "
    "cache and each long story that a friend tells at the table near the warm window"
).split()


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def anthropic_input(usage: Any) -> int:
    """The engine's whole prompt from Anthropic usage (its input_tokens leave out the
    cached part)."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return int(usage.input_tokens) + cached


# --------------------------------------------------------------------------- one turn each


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def chat_turn(url: str, system: str, history: list[dict[str, Any]]) -> tuple[int, int, int]:
    messages: Any = [{"role": "system", "content": system}, *history]
    with _openai(url) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS
        )
    answer = raw.parse()
    assert answer.usage is not None
    return (*head(raw.headers), answer.usage.prompt_tokens)


def head(headers: Any) -> tuple[int, int]:
    """The proxy's count of the prompt it forwarded, and the items it dropped."""
    forwarded = int(headers["x-trimproxy-prompt-tokens"])
    return forwarded, int(headers.get("x-trimproxy-trimmed-messages", "0"))


def responses_turn(
    url: str, system: str, history: list[dict[str, Any]], stream: bool, **fields: Any
) -> tuple[int, int, int]:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "instructions": system,
        "input": history,
        "store": False,
        "max_output_tokens": MAX_TOKENS,
        **fields,
    }
    with _openai(url) as client:
        if not stream:
            raw = client.responses.with_raw_response.create(**args)
            usage = raw.parse().usage
            assert usage is not None
            return (*head(raw.headers), usage.input_tokens)
        with client.responses.with_streaming_response.create(stream=True, **args) as streamed:
            sent = head(streamed.headers)
            done = [e for e in streamed.parse() if e.type == "response.completed"]
    assert len(done) == 1 and done[0].response.usage is not None
    return (*sent, done[0].response.usage.input_tokens)


def messages_turn(
    url: str, system: str, history: list[dict[str, Any]], stream: bool, **fields: Any
) -> tuple[int, int, int]:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "system": system,
        "messages": history,
        "max_tokens": MAX_TOKENS,
        **fields,
    }
    with anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) as client:
        if not stream:
            raw = client.messages.with_raw_response.create(**args)
            return (*head(raw.headers), anthropic_input(raw.parse().usage))
        with client.messages.stream(**args) as streamed:
            sent = head(streamed.response.headers)
            final = streamed.get_final_message()
    return (*sent, anthropic_input(final.usage))


def wait_capacity(url: str) -> float:
    """The proxy's KV capacity once its first scrapes of the engine brought it."""
    capacity = 0.0
    for _ in range(300):  # a scrape every 0.25 s
        text = httpx.get(f"{url}/metrics", timeout=5).text
        capacity = metric_value(text, "trimproxy_kv_capacity_tokens")
        if capacity:
            break
        threading.Event().wait(0.1)
    return capacity
