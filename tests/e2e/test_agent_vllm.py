"""The tool-using conversations and a coding agent's request in front of a real vLLM
engine, through the official SDKs.

They need an engine of their own (``agent_engine``, started for this module): the
session's model (``vllm_stack``) has a FastChat-parity template that refuses a
``tool`` message and renders no tools, and a 2,048 window. This one
(``tests.support.agent_engine``) is the same weights with a ChatML template that
renders tools and tool messages, a window of 8,192 (its KV cache holds 10,240
tokens), and vLLM's auto tool choice on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.conftest import AGENT_WINDOW
from tests.support.agent_engine import (
    AGENT_TOOLS,
    AgentProxies,
    agent_history,
    agent_system,
    agent_tools,
)
from tests.support.closing import Closing
from tests.support.dialect_clients import (
    MAX_TOKENS,
    anthropic_input,
    head,
    messages_turn,
    prose,
    responses_turn,
)
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm


@pytest.fixture
def agent_proxy(agent_engine: VllmStack) -> Iterator[Callable[..., ProxyProcess]]:
    proxies = AgentProxies(agent_engine)
    yield proxies.start
    proxies.stop_all()


TOOL_TURNS = 12
#: Items (Responses) or messages (Messages) of one tool-using turn: the question, the
#: call, its result, the answer.
TURN_SIZE = 4


def _responses_tool_turn(t: int) -> list[dict[str, Any]]:
    call_id = f"call_{t}"
    return [
        {"role": "user", "content": f"Turn {t}: look up {prose(t, 30)}"},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "lookup",
            "arguments": json.dumps({"query": prose(100 + t, 8)}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": prose(200 + t, 40)},
        {"role": "assistant", "content": f"Found {t}: {prose(300 + t, 15)}."},
    ]


def _messages_tool_turn(t: int) -> list[dict[str, Any]]:
    use_id = f"toolu_{t}"
    return [
        {"role": "user", "content": f"Turn {t}: look up {prose(t, 30)}"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking it up."},
                {
                    "type": "tool_use",
                    "id": use_id,
                    "name": "lookup",
                    "input": {"query": prose(100 + t, 8)},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use_id, "content": prose(200 + t, 40)}
            ],
        },
        {"role": "assistant", "content": f"Found {t}: {prose(300 + t, 15)}."},
    ]


LOOKUP = {
    "name": "lookup",
    "description": "Look a phrase up in the project's notes.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_a_trimmed_tool_conversation_keeps_its_pairs(
    agent_engine: VllmStack, agent_proxy: Any, dialect: str
) -> None:
    """Each turn a question, a call, its result and an answer; past the budget whole
    turns go, never a call without its result: the proxy's count of what it kept is
    the engine's count of the client's history from the first kept turn on."""
    budget = 700
    proxy = agent_proxy(max_prompt_tokens=budget)
    system = "You answer with the lookup tool."
    history: list[dict[str, Any]] = []
    trimmed = []
    for t in range(1, TOOL_TURNS + 1):
        turn = _responses_tool_turn(t) if dialect == "responses" else _messages_tool_turn(t)
        if dialect == "responses":
            tools = [{"type": "function", **LOOKUP}]
            send = history + turn[:1]
            forwarded, dropped, engine = responses_turn(
                proxy.url, system, send, t % 2 == 0, tools=tools
            )
        else:
            tools = [
                {
                    "name": LOOKUP["name"],
                    "description": LOOKUP["description"],
                    "input_schema": LOOKUP["parameters"],
                }
            ]
            send = history + turn[:1]
            forwarded, dropped, engine = messages_turn(
                proxy.url, system, send, t % 2 == 0, tools=tools
            )
        assert (forwarded, forwarded <= budget) == (engine, True), (t, forwarded, engine)
        assert dropped % TURN_SIZE == 0, (t, dropped)  # whole turns only
        if dropped:
            # The engine, asked directly, counts the same prompt for the kept turns.
            direct = _direct(agent_engine, dialect, system, send[dropped:], tools)
            assert direct == forwarded, (t, dropped, direct, forwarded)
        trimmed.append(dropped)
        history += turn
    assert max(trimmed) >= TURN_SIZE, trimmed
    print(f"\n{dialect} tool turns: items dropped per turn {trimmed}")


def _direct(engine: VllmStack, dialect: str, system: str, items: list[Any], tools: Any) -> int:
    headers = engine.headers()
    if dialect == "responses":
        body = {
            "model": MODEL_NAME,
            "instructions": system,
            "input": items,
            "tools": tools,
            "store": False,
            "max_output_tokens": MAX_TOKENS,
        }
        answer = httpx.post(
            f"{engine.api_base}/responses", json=body, headers=headers, timeout=120
        ).json()
        return int(answer["usage"]["input_tokens"])
    body = {
        "model": MODEL_NAME,
        "system": system,
        "messages": items,
        "tools": tools,
        "max_tokens": MAX_TOKENS,
    }
    answer = httpx.post(
        f"{engine.api_base}/messages", json=body, headers=headers, timeout=120
    ).json()
    usage = answer["usage"]
    return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens") or 0)


AGENT_CAP = 1024


def test_a_coding_agents_request_is_served_on_an_8k_engine(
    closing: Closing, agent_engine: VllmStack, agent_proxy: Any
) -> None:
    """A 75 kB system prompt, 24 tools and ``max_tokens`` 32,000, as a coding agent
    sends them, with TRIMPROXY_MAX_COMPLETION_TOKENS set.

    The tiny model's tokenizer (4,096 entries) makes 75 kB of prose far more tokens
    than the 8,192 window: that system prompt can never fit, and the answer is the
    400 agent clients act on. The same request with the system prompt cut to what
    fits beside the tools (and 30 turns of history past the window) is trimmed and
    served: 200, the answer capped. (The tools' descriptions are shorter than a real
    agent's: their JSON alone costs this tokenizer ~200 tokens a tool.) The full
    request served whole on an engine whose window holds it:
    ``test_agent_window_vllm.py``.
    """
    proxy = agent_proxy(max_completion_tokens=AGENT_CAP)
    client = closing(anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0))
    system = agent_system()
    request: dict[str, Any] = {
        "model": MODEL_NAME,
        "system": system,
        "tools": agent_tools(),
        "messages": agent_history(30),
        "max_tokens": 32_000,
    }
    # Streamed, as agents send it (the SDK streams any request this long).
    with pytest.raises(anthropic.BadRequestError) as refused, client.messages.stream(**request):
        pass
    error = refused.value.body["error"]  # type: ignore[index]
    found = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"])
    assert error["type"] == "invalid_request_error" and found, error
    needed, maximum = int(found[1]), int(found[2])
    # The budget: the window less the capped answer and one token of slack (budget_of).
    budget = AGENT_WINDOW - AGENT_CAP - 1
    assert needed > maximum == budget, (needed, maximum)
    # What fits: the system prompt cut to its first 1,500 tokens; the 24 tools take
    # about 5,000 more (their JSON costs this 4,096-entry tokenizer ~200 tokens each).
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(agent_engine.model_dir / "tokenizer.json"))
    encoded = tokenizer.encode(system)
    system_tokens = len(encoded.ids)
    request["system"] = system[: encoded.offsets[1500][0]]
    with client.messages.stream(**request) as streamed:
        headers = streamed.response.headers
        message = streamed.get_final_message()
    client.close()
    forwarded, dropped = head(headers)
    assert forwarded == anthropic_input(message.usage)
    assert forwarded <= budget and dropped > 0, (forwarded, dropped)
    assert message.usage.output_tokens <= AGENT_CAP
    assert headers["x-trimproxy-max-tokens-capped"] == "32000", headers
    print(
        f"\nagent request: 75 kB system ({system_tokens} tokens alone) = {needed} tokens "
        f"> {maximum}: 400; "
        f"{len(request['system']) / 1024:.1f} kB system + {AGENT_TOOLS} tools + 30 turns: "
        f"200, {forwarded} tokens forwarded, {dropped} messages dropped"
    )
