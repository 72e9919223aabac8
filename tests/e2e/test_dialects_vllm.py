"""The Responses and Messages routes in front of the real vLLM engine, through the
official SDKs (``openai`` ``responses.create``, ``anthropic`` ``messages.create`` and
``messages.stream``).

On the session's engine (``vllm_stack``: window 2,048, 6,144 KV tokens): a 20-turn
conversation past the budget in each dialect keeps every prompt within the budget,
the proxy's count (``X-Trimproxy-Prompt-Tokens``) is the engine's own input count on
every turn, and the engine's prefix cache hits as often as on the same conversation
sent as chat; the session limit's 409 and admission's 429 come in the dialect's own
envelope; concurrent streamed Responses and Messages answers are admitted without a
preemption, their reservations on the ledger while they run.

The tool-using conversations and the coding agent's request run on an engine of
their own: ``test_agent_vllm.py``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import StartVllmProxy
from tests.sessions.helpers import metric_value
from tests.support.dialect_clients import (
    MAX_TOKENS,
    chat_turn,
    messages_turn,
    prose,
    responses_turn,
    wait_capacity,
)
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

BUDGET = 600
TURNS = 20


def conversation(arm: int) -> tuple[str, list[tuple[str, str]]]:
    """The system prompt and ``TURNS`` (user, assistant) pairs; the arm's number opens
    the system prompt, so that no arm hits another's cached blocks, and nothing else
    differs between arms."""
    system = f"Arm {arm}. You are a terse assistant taking part in a test."
    turns = [
        (f"Turn {t}: {prose(t, 45)}?", f"Answer {t}: {prose(10_000 + t, 25)}.")
        for t in range(1, TURNS + 1)
    ]
    return system, turns


ARMS = ("chat", "responses", "messages.create", "messages.stream")


def _turn(arm: str, url: str, system: str, history: list[dict[str, Any]], turn: int) -> Any:
    if arm == "chat":
        return chat_turn(url, system, history)
    if arm == "responses":  # streamed on every other turn
        return responses_turn(url, system, history, stream=turn % 2 == 0)
    return messages_turn(url, system, history, stream=arm == "messages.stream")


# --------------------------------------------------------------------------- 20 turns


def test_a_conversation_past_the_budget_in_every_dialect(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy(max_prompt_tokens=BUDGET)
    ratios: dict[str, float] = {}
    for number, arm in enumerate(ARMS, start=1):
        system, turns = conversation(number)
        history: list[dict[str, Any]] = []
        trimmed = []
        before = vllm_idle.metrics()
        for turn, (question, reply) in enumerate(turns, start=1):
            history.append({"role": "user", "content": question})
            forwarded, dropped, engine = _turn(arm, proxy.url, system, history, turn)
            assert forwarded == engine, (arm, turn, forwarded, engine)
            assert forwarded <= BUDGET, (arm, turn, forwarded)
            trimmed.append(dropped)
            # The same conversation in every arm: the answers are fixed text.
            history.append({"role": "assistant", "content": reply})
        after, _ = vllm_idle.wait_for_metrics(lambda m: m.running == 0)
        hits = after.prefix_hits - before.prefix_hits
        queries = after.prefix_queries - before.prefix_queries
        ratios[arm] = hits / queries
        assert trimmed[0] == 0 and max(trimmed) > 0, (arm, trimmed)
        print(f"\n{arm}: hit ratio {ratios[arm]:.3f} ({hits:.0f}/{queries:.0f} tokens)")
    for arm in ARMS[1:]:
        assert abs(ratios[arm] - ratios["chat"]) <= 0.05, ratios


# --------------------------------------------------------------------------- envelopes


def _anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    return message


def _openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]["message"]
    return message


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120.0)


def test_the_session_limit_answers_in_each_dialects_envelope(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy(session_max_turns=2, session_limit_action="reject")
    for path, key in (("/v1/responses", "input"), ("/v1/messages", "messages")):
        history: list[dict[str, Any]] = []
        statuses = []
        for turn in range(1, 4):
            history.append({"role": "user", "content": f"{path} turn {turn}: {prose(turn, 20)}"})
            body = {"model": MODEL_NAME, key: history, "max_tokens": MAX_TOKENS}
            if key == "input":
                body = {
                    "model": MODEL_NAME,
                    "input": history,
                    "store": False,
                    "max_output_tokens": MAX_TOKENS,
                }
            response = _post(proxy.url, path, body)
            statuses.append(response.status_code)
            history.append({"role": "assistant", "content": f"Answer {turn}."})
        assert statuses == [200, 200, 409], (path, statuses)
        if key == "messages":
            message = _anthropic_error(response, 409, "invalid_request_error")
        else:
            message = _openai_error(response, 409)
        assert "TRIMPROXY_SESSION_MAX_TURNS" in message, message


def _hold_the_cache(url: str, opened: threading.Event, release: threading.Event) -> None:
    """A streamed chat answer that holds its reservation until ``release``."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prose(7, 30)}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=300.0) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        opened.set()
        release.wait(timeout=300)


def test_admission_refusals_answer_in_each_dialects_envelope(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    # A fifth of the 6,112-token cache: one answer of 1,500 tokens fills it.
    proxy = start_vllm_proxy(kv_admission="auto", kv_admission_fraction=0.3, admission_timeout=0)
    assert wait_capacity(proxy.url) > 0
    opened, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_the_cache, args=(proxy.url, opened, release))
    holder.start()
    try:
        assert opened.wait(timeout=120)
        history = [{"role": "user", "content": prose(8, 200)}]
        response = _post(
            proxy.url, "/v1/messages", {"model": MODEL_NAME, "messages": history, "max_tokens": 400}
        )
        message = _anthropic_error(response, 429, "rate_limit_error")
        assert "KV cache had no room" in message and response.headers["retry-after"]
        response = _post(
            proxy.url,
            "/v1/responses",
            {"model": MODEL_NAME, "input": history, "store": False, "max_output_tokens": 400},
        )
        assert "KV cache had no room" in _openai_error(response, 429)
        assert response.json()["error"]["type"] == "rate_limit_error"
    finally:
        release.set()
        holder.join(timeout=60)


# --------------------------------------------------------------------------- admission


async def _responses_stream(client: openai.AsyncOpenAI, seed: int, **fields: Any) -> int:
    stream = await client.responses.create(
        model=MODEL_NAME,
        input=[{"role": "user", "content": f"Stream {seed}: {prose(seed, 500)}"}],
        store=False,
        stream=True,
        **fields,
    )
    output = 0
    async for event in stream:
        if event.type == "response.completed" and event.response.usage is not None:
            output = event.response.usage.output_tokens
    return output


async def _messages_stream(client: anthropic.AsyncAnthropic, seed: int) -> int:
    async with client.messages.stream(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": f"Stream {seed}: {prose(seed, 500)}"}],
        max_tokens=300,
    ) as stream:
        final = await stream.get_final_message()
    return final.usage.output_tokens


def _watch_reserved(url: str, done: threading.Event, seen: list[float]) -> None:
    with httpx.Client(timeout=5.0) as client:
        while not done.is_set():
            seen.append(
                metric_value(client.get(f"{url}/metrics").text, "trimproxy_kv_reserved_tokens")
            )


def test_concurrent_dialect_streams_are_admitted_without_preemption(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    """Eight streamed answers at once (four Responses, four Messages), each ~700 prompt
    tokens and 300 answer tokens: 8,000 tokens of KV on a 6,112-token cache."""
    proxy = start_vllm_proxy(kv_admission="auto", admission_timeout=600)
    capacity = wait_capacity(proxy.url)
    assert capacity == (192 - 1) * 32
    before = vllm_idle.metrics().preemptions
    seen: list[float] = []
    done = threading.Event()
    watcher = threading.Thread(target=_watch_reserved, args=(proxy.url, done, seen))
    watcher.start()

    async def load() -> list[int]:
        async with (
            openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="-", max_retries=0) as oai,
            anthropic.AsyncAnthropic(base_url=proxy.url, api_key="-", max_retries=0) as ant,
        ):
            jobs = [
                _responses_stream(oai, s, max_output_tokens=300, extra_body={"ignore_eos": True})
                for s in range(4)
            ]
            jobs += [_messages_stream(ant, s) for s in range(4, 8)]
            return list(await asyncio.gather(*jobs))

    try:
        outputs = asyncio.run(load())
    finally:
        done.set()
        watcher.join(timeout=30)
    preempted = vllm_idle.metrics().preemptions - before
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    print(
        f"\n8 dialect streams: outputs {outputs}, {preempted:.0f} preemptions, "
        f"peak reserved {max(seen):.0f} of {capacity:.0f} tokens"
    )
    # Responses run to max_output_tokens (ignore_eos); Messages has no ignore_eos, and
    # the random model may end one early.
    assert outputs[:4] == [300] * 4 and all(0 < out <= 300 for out in outputs[4:]), outputs
    assert preempted == 0
    assert 0 < max(seen) <= capacity  # on the ledger while they ran
    assert metric_value(text, "trimproxy_admission_wait_seconds_count") == 8
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0


def test_a_streamed_response_told_no_limit_grows_its_reservation(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    """A streamed Responses answer without ``max_output_tokens`` runs past the default
    reserve (ignore_eos: to the window): the watch follows its deltas and counts it."""
    proxy = start_vllm_proxy(kv_admission="auto", default_completion_reserve=64)
    assert wait_capacity(proxy.url) > 0

    async def answer() -> int:
        async with openai.AsyncOpenAI(
            base_url=f"{proxy.url}/v1", api_key="-", max_retries=0
        ) as client:
            return await _responses_stream(client, 1, extra_body={"ignore_eos": True})

    output = asyncio.run(answer())
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert output > 64
    assert metric_value(text, "trimproxy_admission_overrun_total") == 1
    assert metric_value(text, "trimproxy_admission_overrun_tokens_total") == output - 64
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0
