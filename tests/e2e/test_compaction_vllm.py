"""Compaction in front of a real vLLM engine, through the official ``openai`` SDK:
``responses.compact`` then ``responses.create`` with the compacted output and a new
message is served within the budget, counted as the engine counts; the same after a
restart of the proxy (a configured key); a changed item and another key's are 400
and never reach the engine.

The engine is the tool-rendering one (``tests.support.agent_engine``, started for this
module): the session's engine refuses the ``tool`` messages an agent's items become.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import orjson
import pytest

from proxy.pipeline.prepare import PROMPT_TOKENS
from tests.compaction.helpers import agent_input, dumped
from tests.e2e.conftest import AGENT_WINDOW
from tests.support.agent_engine import AgentProxies
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

WINDOW = AGENT_WINDOW
BUDGET = 3000
KEY = "5" * 64


@pytest.fixture
def engine(agent_engine: VllmStack) -> VllmStack:
    """The shared tool-rendering engine (window 8,192; tests/e2e/conftest.py)."""
    return agent_engine


@pytest.fixture
def start(engine: VllmStack) -> Iterator[Callable[..., ProxyProcess]]:
    proxies = AgentProxies(engine)
    yield proxies.start
    proxies.stop_all()


def _create(client: openai.OpenAI, items: list[Any]) -> tuple[dict[str, Any], int]:
    raw = client.responses.with_raw_response.create(
        model=MODEL_NAME,
        input=[*items, {"type": "message", "role": "user", "content": "Next step."}],
        max_output_tokens=16,
    )
    return orjson.loads(raw.http_response.content), int(raw.headers[PROMPT_TOKENS])


def test_compact_then_create_on_the_real_engine(
    closing: Closing, start: Callable[..., ProxyProcess]
) -> None:
    proxy = start(max_prompt_tokens=BUDGET, compaction_key=KEY)
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="key-a", timeout=120))
    history = agent_input(24, size=600)
    out = dumped(client.responses.compact(model=MODEL_NAME, input=history).output)  # type: ignore[arg-type]
    assert [i["type"] for i in out] == ["message", "compaction"]
    answer, forwarded = _create(client, out)
    assert answer["status"] in ("completed", "incomplete")
    assert forwarded <= BUDGET
    # Within the budget, counted as the engine counts it: the item's developer message
    # goes to this template as a system one, as vLLM hands it over.
    assert answer["usage"]["input_tokens"] == forwarded
    # The uncompacted history is over the budget: it is trimmed, and compacted, fits.
    _, whole = _create(client, history)
    print(f"\nforwarded: compacted {forwarded}, uncompacted {whole} (budget {BUDGET})")
    proxy.stop()
    again = start(max_prompt_tokens=BUDGET, compaction_key=KEY)
    client = closing(openai.OpenAI(base_url=again.api_base, api_key="key-a", timeout=120))
    after, forwarded_after = _create(client, out)
    assert after["usage"]["input_tokens"] <= forwarded_after <= BUDGET
    changed = {**out[-1], "encrypted_content": out[-1]["encrypted_content"][:-8] + "AAAAAAAA"}
    with pytest.raises(openai.BadRequestError) as tampered:
        _create(client, [*out[:-1], changed])
    assert tampered.value.code == "invalid_compaction_item"
    other = closing(openai.OpenAI(base_url=again.api_base, api_key="key-b", timeout=120))
    with pytest.raises(openai.BadRequestError) as foreign:
        _create(other, out)
    assert foreign.value.code == "invalid_compaction_item"
