"""A streamed answer outlives its engine, on real vLLM: two engines (CPU build, tiny
model) behind trimproxy, a streamed answer of 1,500 tokens (chat, then the Responses
dialect), and the engine that generates it SIGKILLed (its whole process group) after
the client read ~100 of them (an answer this long is still being generated then,
however slowly the client reads) (docs/architecture.md §23). Each test starts its own pair.

The ``openai`` SDK reads one complete answer; the other engine's own request log
(``--enable-log-requests`` at DEBUG) shows the prompt it was given: the conversation
rendered by its chat template with the partial answer as the final assistant message,
left open (``continue_final_message``: no end-of-turn after it, no new assistant turn;
on the Responses route, vLLM's reading of a final assistant item with status
``incomplete``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import openai
import pytest

from bench.replicas import start_all
from tests.e2e.conftest import ENGINE_NICE
from tests.observability.promtext import scrape
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess, free_port
from tests.support.vllm_stack import EngineMetrics, VllmStack, build_vllm_model

pytestmark = pytest.mark.vllm

ANSWER = 1500
KILL_AFTER = 100
_BODY = re.compile(r"Request \S+ JSON body: (\{.*\})$", re.MULTILINE)
_PROMPT = re.compile(r"Request (\S+) details: prompt: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


@pytest.fixture
def engines() -> Iterator[list[VllmStack]]:
    if os.environ.get("TRIMPROXY_SKIP_VLLM") == "1":
        pytest.skip("TRIMPROXY_SKIP_VLLM=1: the real vLLM engine is switched off")
    port = free_port()
    stacks = [
        VllmStack(
            build_vllm_model(),
            kv_blocks=127,
            max_model_len=2048,
            nice=ENGINE_NICE,
            host=f"127.0.0.{2 + i}",
            port=port,
            extra_args=("--enable-log-requests",),
            env={"VLLM_LOGGING_LEVEL": "DEBUG"},
        )
        for i in range(2)
    ]
    with ExitStack() as stopping:
        for stack in stacks:
            stopping.callback(stack.stop)
        start_all(stacks)
        yield stacks


def running(engine: VllmStack) -> float:
    try:
        text = httpx.get(f"{engine.base_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0.0
    return EngineMetrics.parse(text).running


def prompts(engine: VllmStack) -> list[str]:
    """The prompts the engine rendered, from its request log (DEBUG)."""
    text = engine.log.read_text(errors="replace")
    return [ast.literal_eval(m.group(2)) for m in _PROMPT.finditer(text)]


def bodies(engine: VllmStack) -> list[dict[str, Any]]:
    """The request bodies the engine received, from its request log (DEBUG)."""
    text = engine.log.read_text(errors="replace")
    return [json.loads(m.group(1)) for m in _BODY.finditer(text)]


def proxy_settings(engines: list[VllmStack]) -> dict[str, Any]:
    return {
        "upstream_url": ",".join(e.base_url for e in engines),
        "tokenizer": "approx",
        "health_interval": 1,
        "upstream_metrics_interval": 0,
    }


@contextmanager
def failing_with_the_log(proxy: ProxyProcess) -> Iterator[None]:
    """An error event the SDK raises fails the test with the proxy's log, which says why
    the answer was not continued."""
    try:
        yield
    except openai.APIError as exc:
        pytest.fail(f"{exc}\nthe proxy's log:\n{proxy.logs()[-4000:]}")


def kill_the_one_answering(engines: list[VllmStack]) -> VllmStack:
    """SIGKILL the engine the answer is on: the one whose request log holds a request
    (the other has had none yet); it must still be generating, or there is nothing to
    continue."""
    victim = next(e for e in engines if bodies(e))
    assert victim.proc is not None
    assert running(victim) >= 1, "the engine finished the answer before the kill: raise ANSWER"
    os.killpg(victim.proc.pid, signal.SIGKILL)
    return victim


def test_a_stream_survives_its_vllm_engine_killed_mid_answer(
    closing: Closing, engines: list[VllmStack]
) -> None:
    with ProxyProcess(proxy_settings(engines)) as proxy:
        client = closing(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0))
        stream = client.chat.completions.create(
            model=engines[0].model,
            messages=[{"role": "user", "content": "Tell me a long story about a river."}],
            max_tokens=ANSWER,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        ids, texts, finishes, usage = set(), [], [], None
        victim: VllmStack | None = None
        with failing_with_the_log(proxy):
            for chunk in stream:  # raises openai.APIError on an error event
                ids.add(chunk.id)
                for choice in chunk.choices:
                    texts.append(choice.delta.content or "")
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
                if chunk.usage is not None:
                    usage = chunk.usage
                if victim is None and len(texts) >= KILL_AFTER:
                    victim = kill_the_one_answering(engines)
        continued = scrape(proxy.url).value("trimproxy_answers_continued_total", reason="reset")
        log = proxy.logs()
    assert victim is not None
    survivor = next(e for e in engines if e is not victim)
    text = "".join(texts)
    assert len(ids) == 1 and finishes == ["length"]
    assert usage is not None and usage.completion_tokens >= ANSWER - 5
    assert continued == 1 and '"continued":"reset@' in log, log[-4000:]
    # The survivor was asked to continue the partial answer: the request it received
    # ends with it as the final assistant message, to continue; the prompt it rendered
    # ends with that text, its turn left open; the client's answer goes on from it.
    asked = [b for b in bodies(survivor) if b.get("continue_final_message")]
    assert len(asked) == 1, bodies(survivor)
    assert asked[0]["add_generation_prompt"] is False
    assert asked[0]["max_tokens"] < ANSWER
    last = asked[0]["messages"][-1]
    partial = last["content"]
    assert last["role"] == "assistant" and len(partial) >= len("".join(texts[:KILL_AFTER]))
    assert text.startswith(partial) and len(text) > len(partial)
    assert any(p.endswith("<|im_start|>assistant\n" + partial) for p in prompts(survivor))


def test_a_responses_stream_survives_its_vllm_engine_killed_mid_answer(
    closing: Closing,
    engines: list[VllmStack],
) -> None:
    """The Responses dialect: the survivor gets the partial answer as a final assistant
    item with status ``incomplete``, which vLLM continues (``continue_final_message``);
    the SDK reads one response, its events numbered on, its last one carrying the
    whole text."""
    with ProxyProcess(proxy_settings(engines)) as proxy:
        client = closing(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0))
        events: list[Any] = []
        texts: list[str] = []
        victim: VllmStack | None = None
        with (
            client.responses.stream(
                model=engines[0].model,
                input="Tell me a long story about a river.",
                max_output_tokens=ANSWER,
                extra_body={"ignore_eos": True},
            ) as stream,
            failing_with_the_log(proxy),
        ):
            for event in stream:  # raises openai.APIError on an error event
                events.append(event)
                if event.type == "response.output_text.delta":
                    texts.append(event.delta)
                if victim is None and len(texts) >= KILL_AFTER:
                    victim = kill_the_one_answering(engines)
        continued = scrape(proxy.url).value("trimproxy_answers_continued_total", reason="reset")
        log = proxy.logs()
    assert victim is not None
    survivor = next(e for e in engines if e is not victim)
    text = "".join(texts)
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.id == events[0].response.id and done.output_text == text
    assert done.usage is not None and done.usage.output_tokens >= ANSWER - 5
    assert continued == 1 and '"continued":"reset@' in log, log[-4000:]
    asked = [b for b in bodies(survivor) if isinstance(b.get("input"), list)]
    assert len(asked) == 1, bodies(survivor)
    assert asked[0]["max_output_tokens"] < ANSWER
    last = asked[0]["input"][-1]
    assert (last["role"], last["status"]) == ("assistant", "incomplete")
    partial = last["content"][0]["text"]
    assert len(partial) >= len("".join(texts[:KILL_AFTER]))
    assert text.startswith(partial) and len(text) > len(partial)
    assert any(p.endswith("<|im_start|>assistant\n" + partial) for p in prompts(survivor))
