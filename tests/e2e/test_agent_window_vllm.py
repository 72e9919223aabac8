"""A coding agent's whole request (a 75 kB system prompt, 24 tools, ``max_tokens``
32,000) served by a real vLLM engine whose window holds it, through the ``anthropic``
SDK: with TRIMPROXY_MAX_COMPLETION_TOKENS set it is 200 and the engine is asked for
the cap; without the cap the same request is refused, by the proxy and by the engine.

The tiny model's 4,096-entry tokenizer makes that system prompt 17,275 tokens (a real
tokenizer's ~4 bytes a token makes it ~19,000): no 8,192 window holds it
(``test_agent_vllm.py`` proves the 400 agent clients act on). This module's engine
(``tests.support.agent_engine``, started once for it) has the smallest window in
steps of 8,192 that holds the system prompt, the tools and the capped answer: 24,576.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.conftest import ENGINE_NICE, ENGINE_START_TIMEOUT, VLLM_API_KEY
from tests.support.agent_engine import (
    AgentProxies,
    agent_history,
    agent_stack,
    agent_system,
    agent_tools,
)
from tests.support.closing import Closing
from tests.support.dialect_clients import anthropic_input, head
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

WINDOW = 24_576
CAP = 1024
ASKED = 32_000
MAX_TOKENS_SUM = "vllm:request_params_max_tokens_sum"


@pytest.fixture(scope="module")
def window_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    folder = tmp_path_factory.mktemp("agent-window-model")
    with agent_stack(
        folder, WINDOW, api_key=VLLM_API_KEY, nice=ENGINE_NICE, startup_timeout=ENGINE_START_TIMEOUT
    ) as engine:
        print(f"\n{WINDOW}-window agent engine up: ready {engine.timings.ready:.1f}s")
        yield engine


@pytest.fixture
def window_proxy(window_engine: VllmStack) -> Iterator[Callable[..., ProxyProcess]]:
    proxies = AgentProxies(window_engine)
    yield proxies.start
    proxies.stop_all()


def _request() -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "system": agent_system(),
        "tools": agent_tools(),
        "messages": agent_history(30),
        "max_tokens": ASKED,
    }


def test_a_coding_agents_whole_request_is_served_with_the_cap(
    closing: Closing, window_engine: VllmStack, window_proxy: Callable[..., ProxyProcess]
) -> None:
    """Streamed, as agents send it: 200, the 75 kB system prompt and the 24 tools
    forwarded whole (the history trimmed to what fits beside them), the engine's
    count of the prompt the proxy's, and the engine asked for ``max_tokens`` = the cap
    (its own histogram of the ``max_tokens`` it was asked for grew by exactly the cap)."""
    from tokenizers import Tokenizer

    proxy = window_proxy(max_completion_tokens=CAP)
    client = closing(anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0))
    request = _request()
    asked_before = window_engine.metrics().value(MAX_TOKENS_SUM)
    began = time.monotonic()
    with client.messages.stream(**request) as streamed:
        assert streamed.response.status_code == 200
        headers = streamed.response.headers
        message = streamed.get_final_message()
    took = time.monotonic() - began
    forwarded, dropped = head(headers)
    assert forwarded == anthropic_input(message.usage)  # the count is the engine's
    assert forwarded <= WINDOW - CAP - 1 and 0 < dropped < len(request["messages"])
    assert headers["x-trimproxy-max-tokens-capped"] == str(ASKED), headers
    # The engine records a request's max_tokens as it finishes: wait for the record.
    asked, _ = window_engine.wait_for_metrics(lambda m: m.value(MAX_TOKENS_SUM) > asked_before)
    assert asked.value(MAX_TOKENS_SUM) - asked_before == CAP
    assert message.usage.output_tokens <= CAP
    # The system prompt went whole: the prompt holds more than its tokens alone.
    tokenizer = Tokenizer.from_file(str(window_engine.model_dir / "tokenizer.json"))
    system_tokens = len(tokenizer.encode(request["system"]).ids)
    assert forwarded > system_tokens
    print(
        f"\nagent request ({len(request['system']) / 1024:.0f} kB system = {system_tokens} "
        f"tokens, {len(request['tools'])} tools, {len(request['messages'])} messages, "
        f"max_tokens {ASKED}) on a {WINDOW} window, cap {CAP}: 200 in {took:.1f}s, "
        f"{forwarded} tokens forwarded, {dropped} messages dropped, "
        f"{message.usage.output_tokens} tokens answered"
    )


def test_without_the_cap_the_same_request_is_refused(
    closing: Closing, window_engine: VllmStack, window_proxy: Callable[..., ProxyProcess]
) -> None:
    """No TRIMPROXY_MAX_COMPLETION_TOKENS: 32,000 answer tokens leave the prompt no room
    in 24,576, and the proxy says so in Anthropic's envelope, naming ``max_tokens``;
    sent to the engine directly, it refuses the same request itself."""
    proxy = window_proxy()
    client = closing(anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0))
    request = _request()
    with pytest.raises(anthropic.BadRequestError) as refused, client.messages.stream(**request):
        pass
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error", error
    assert f"maximum context length is {WINDOW}" in error["message"], error
    assert f"{ASKED} completion tokens (max_tokens)" in error["message"], error
    direct = httpx.post(
        f"{window_engine.api_base}/messages",
        json=request,
        headers=window_engine.headers(),
        timeout=120,
    )
    assert direct.status_code == 400, direct.text
    assert str(ASKED) in direct.text, direct.text
    print(f"\nwithout the cap: proxy 400 {error['message']!r}; engine 400 {direct.text[:300]}")
