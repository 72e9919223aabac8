"""The trim ladder on every prompt route (docs/architecture.md §6): a coding agent's
task (one user message, then tool rounds of a call and a ~600-token output, the client
appending every round) through the official SDKs, in front of the simulated engine
with an 8,192 window. Every round is answered within the budget with the engine's own
count, the oldest outputs cleared and the latest whole; with
TRIMPROXY_CLEAR_TOOL_OUTPUTS=off the same task is refused a few rounds in, as every
dialect was before the ladder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.app import create_app
from proxy.ladder import placeholder
from proxy.metrics import Metrics
from tests.support.closing import AsyncClosing
from tests.support.inprocess import make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream, start_sim_thread

WINDOW = 8192
ANSWER = 16
BUDGET = WINDOW - ANSWER - 1
ROUNDS = 42
SYSTEM = "You are a coding agent. " + " ".join(f"rule{i} applies always." for i in range(400))
TASK = "Fix the failing parser tests in src/parser.py and run the whole suite."


def output(k: int) -> str:
    """Round k's tool output: ~600 tokens of a test run's log."""
    return f"round {k}: " + " ".join(f"test_{k}_{i} PASSED line {i}" for i in range(120))


@pytest.fixture(scope="module")
def window_sim() -> Iterator[SimUpstream]:
    sim = start_sim_thread(max_model_len=WINDOW)
    try:
        yield sim
    finally:
        sim.stop()


async def _proxy(sim: SimUpstream, **settings: Any) -> AsyncIterator[str]:
    app = create_app(
        make_settings(sim.url, tokenizer="upstream", upstream_metrics_interval=0,
                      max_completion_tokens=512, **settings),
        Metrics(),
    )  # fmt: skip
    async with served(app) as url:
        yield url


@pytest.fixture
async def ladder_url(window_sim: SimUpstream) -> AsyncIterator[str]:
    async for url in _proxy(window_sim):
        yield url


@pytest.fixture
async def off_url(window_sim: SimUpstream) -> AsyncIterator[str]:
    async for url in _proxy(window_sim, clear_tool_outputs="off"):
        yield url


# One round of each dialect: the items it appends (a call and its output).
def chat_round(k: int) -> list[dict[str, Any]]:
    call = {"id": f"call_{k}", "type": "function",
            "function": {"name": "run", "arguments": orjson.dumps({"k": k}).decode()}}  # fmt: skip
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{k}", "content": output(k)},
    ]


def responses_round(k: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": f"call_{k}", "name": "run",
         "arguments": orjson.dumps({"k": k}).decode()},
        {"type": "function_call_output", "call_id": f"call_{k}", "output": output(k)},
    ]  # fmt: skip


def messages_round(k: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant",
         "content": [{"type": "tool_use", "id": f"toolu_{k}", "name": "run", "input": {"k": k}}]},
        {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": output(k)}]},
    ]  # fmt: skip


async def _chat(url: str, history: list[Any], aclosing: AsyncClosing) -> tuple[Any, int]:
    client = await aclosing(openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    raw = await client.chat.completions.with_raw_response.create(
        model="sim-model", messages=[*messages, *history], max_tokens=ANSWER
    )
    usage = raw.parse().usage
    assert usage is not None
    return raw.headers, usage.prompt_tokens


async def _responses(url: str, history: list[Any], aclosing: AsyncClosing) -> tuple[Any, int]:
    client = await aclosing(openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    raw = await client.responses.with_raw_response.create(
        model="sim-model", instructions=SYSTEM, store=False, max_output_tokens=ANSWER,
        input=[{"role": "user", "content": TASK}, *history],
    )  # fmt: skip
    usage = raw.parse().usage
    assert usage is not None
    return raw.headers, usage.input_tokens


async def _messages(url: str, history: list[Any], aclosing: AsyncClosing) -> tuple[Any, int]:
    client = await aclosing(anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0))
    raw = await client.messages.with_raw_response.create(
        model="sim-model", system=SYSTEM, max_tokens=ANSWER,
        messages=[{"role": "user", "content": TASK}, *history],
    )  # fmt: skip
    usage = (await raw.parse()).usage
    return raw.headers, usage.input_tokens + (usage.cache_read_input_tokens or 0)


Send = Callable[[str, list[Any], AsyncClosing], Any]
DIALECTS: dict[str, tuple[Send, Callable[[int], list[dict[str, Any]]], str]] = {
    "chat": (_chat, chat_round, "/v1/chat/completions"),
    "responses": (_responses, responses_round, "/v1/responses"),
    "messages": (_messages, messages_round, "/v1/messages"),
}


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_an_agents_task_is_served_past_the_window(
    dialect: str, aclosing: AsyncClosing, ladder_url: str, window_sim: SimUpstream
) -> None:
    send, one_round, path = DIALECTS[dialect]
    history: list[Any] = []
    cleared = []
    for k in range(ROUNDS):
        history.extend(one_round(k))
        headers, engine_count = await send(ladder_url, history, aclosing)
        forwarded = int(headers["x-trimproxy-prompt-tokens"])
        assert forwarded <= BUDGET, (k, forwarded)
        assert engine_count == forwarded, k  # the count is the engine's
        cleared.append(int(headers.get("x-trimproxy-cleared-tool-outputs", "0")))
    assert cleared[0] == 0 and cleared[-1] > ROUNDS // 2, cleared
    sent = orjson.loads(window_sim.requests(path)[-1]["body"])
    text = orjson.dumps(sent).decode()
    for k in range(ROUNDS):  # every call is still there, with its id
        assert f"_{k}" in text
    for k in range(ROUNDS - 3, ROUNDS):  # the latest three outputs whole
        assert output(k) in text
    assert output(0) not in text and "tool output cleared by trimproxy" in text
    assert placeholder(0).split(":")[0] in text
    assert TASK in text  # the user message that opened the task


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_without_the_ladder_the_task_is_refused_a_few_rounds_in(
    dialect: str, aclosing: AsyncClosing, off_url: str
) -> None:
    send, one_round, _ = DIALECTS[dialect]
    history: list[Any] = []
    for k in range(ROUNDS):
        history.extend(one_round(k))
        try:
            await send(off_url, history, aclosing)
        except (openai.BadRequestError, anthropic.BadRequestError) as refused:
            assert "context" in str(refused).lower() or "too long" in str(refused).lower()
            assert 5 <= k < 20, k
            return
    pytest.fail("the whole-turn trim alone served the whole task")
