"""The trim ladder on a real vLLM engine (window 8,192) through the official SDKs: one
coding agent's task and 150 tool rounds per dialect (chat, Responses, Messages), the
client appending every round. Every round is answered 200 within the budget, the
proxy's count equal to the engine's ``usage``, and the engine's prefix cache keeps
hitting: its hit ratio over the loop (``vllm:prefix_cache_hits_total`` over
``queries_total``) is printed beside the ideal (the ratio if nothing were ever cleared:
each prompt the one before plus a round) and is at least 0.7.

One engine (``tests.support.agent_engine``: a ChatML template that renders tool calls
and tool messages) and one proxy (the ``hf:`` counter on the engine's tokenizer) serve
the three loops; answers are 4 tokens, to keep it short.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import AGENT_WINDOW
from tests.support.agent_engine import AgentProxies
from tests.support.dialect_clients import anthropic_input, head, prose
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

WINDOW = AGENT_WINDOW
ANSWER = 4
BUDGET = WINDOW - ANSWER - 1
ROUNDS = 150
SYSTEM = prose(7, 500)
TASK = "Fix the failing parser tests in src/parser.py, then run the whole suite."


def output(k: int) -> str:
    """Round k's tool output: a few hundred tokens of a log."""
    return f"round {k} log: " + prose(1000 + k, 220)


@pytest.fixture(scope="module")
def engine(agent_engine: VllmStack) -> VllmStack:
    """The shared tool-rendering engine (window 8,192; tests/e2e/conftest.py)."""
    return agent_engine


@pytest.fixture(scope="module")
def proxy(engine: VllmStack) -> Iterator[ProxyProcess]:
    proxies = AgentProxies(engine)
    yield proxies.start(max_completion_tokens=512)
    proxies.stop_all()


def chat_round(k: int) -> list[dict[str, Any]]:
    call = {"id": f"call{k}", "type": "function",
            "function": {"name": "run", "arguments": f'{{"step": {k}}}'}}  # fmt: skip
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call{k}", "content": output(k)},
    ]


def responses_round(k: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": f"call{k}", "name": "run",
         "arguments": f'{{"step": {k}}}'},
        {"type": "function_call_output", "call_id": f"call{k}", "output": output(k)},
    ]  # fmt: skip


def messages_round(k: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant",
         "content": [{"type": "tool_use", "id": f"toolu{k}", "name": "run", "input": {"step": k}}]},
        {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": f"toolu{k}", "content": output(k)}]},
    ]  # fmt: skip


def send_chat(url: str, history: list[Any]) -> tuple[Any, int]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, max_tokens=ANSWER,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK},
                      *history],
        )  # fmt: skip
        usage = raw.parse().usage
    assert usage is not None
    return raw.headers, usage.prompt_tokens


def send_responses(url: str, history: list[Any]) -> tuple[Any, int]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with client:
        raw = client.responses.with_raw_response.create(
            model=MODEL_NAME, instructions=SYSTEM, store=False, max_output_tokens=ANSWER,
            input=[{"role": "user", "content": TASK}, *history],
        )  # fmt: skip
        usage = raw.parse().usage
    assert usage is not None
    return raw.headers, usage.input_tokens


def send_messages(url: str, history: list[Any]) -> tuple[Any, int]:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with client:
        raw = client.messages.with_raw_response.create(
            model=MODEL_NAME, system=SYSTEM, max_tokens=ANSWER,
            messages=[{"role": "user", "content": TASK}, *history],
        )  # fmt: skip
        usage = raw.parse().usage
    return raw.headers, anthropic_input(usage)


DIALECTS: dict[str, tuple[Callable[[str, list[Any]], tuple[Any, int]], Callable[[int], Any]]] = {
    "chat": (send_chat, chat_round),
    "responses": (send_responses, responses_round),
    "messages": (send_messages, messages_round),
}


def _received(url: str, endpoint: str) -> float:
    """The proxy's summed count of the prompts it received on ``endpoint``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "trimproxy_prompt_tokens_sum"
        and sample.labels.get("stage") == "received"
        and sample.labels.get("endpoint") == endpoint
    )


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_an_agents_task_of_150_rounds_keeps_the_prefix_cache(
    dialect: str, engine: VllmStack, proxy: ProxyProcess
) -> None:
    send, one_round = DIALECTS[dialect]
    before = engine.metrics()
    received_before = _received(proxy.url, dialect)
    history: list[Any] = []
    cleared = 0
    last = 0.0
    began = time.monotonic()
    for k in range(ROUNDS):
        history.extend(one_round(k))
        at = _received(proxy.url, dialect) if k == ROUNDS - 1 else 0.0
        headers, engine_count = send(proxy.url, history)
        forwarded, _ = head(headers)
        assert forwarded <= BUDGET, (k, forwarded)
        assert forwarded == engine_count, (k, forwarded, engine_count)
        cleared = int(headers.get("x-trimproxy-cleared-tool-outputs", "0"))
        if k == ROUNDS - 1:
            last = _received(proxy.url, dialect) - at
    took = time.monotonic() - began
    after = engine.metrics()
    hits = after.prefix_hits - before.prefix_hits
    queries = after.prefix_queries - before.prefix_queries
    ratio = hits / queries
    received = _received(proxy.url, dialect) - received_before
    ideal = (received - last) / received
    print(
        f"\n{dialect}: {ROUNDS} rounds in {took:.0f}s, {received / ROUNDS:.0f} tokens a "
        f"request as sent, {cleared} outputs cleared in the last; prefix-cache hit ratio "
        f"{ratio:.3f} (ideal, nothing cleared: {ideal:.3f})"
    )
    assert cleared > 0
    assert ratio >= 0.7, (ratio, ideal)
