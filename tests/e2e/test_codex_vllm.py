"""The real Codex CLI with OpenAI's built-in provider pointed at a real ``trimproxy
serve`` in front of a real vLLM engine, with a low auto-compaction limit: a session
that compacts remotely (``compaction_trigger``) at least twice completes with every turn
exit 0, over the Responses WebSocket with no fallback; every prompt the engine got was
within the budget as the engine counts it, and none held a compaction item (vLLM
refuses one: "Unsupported input item type").

Codex's own prompt (its instructions and tools) is about 27k tokens in the tiny model's
tokenizer, so the engine is the tool-rendering one (``tests.support.agent_engine``) with
a window of 32,768 positions. Its answers are capped at a few tokens by the model's
generation config (``--override-generation-config``): Codex sets no output limit, and a
random model rarely says ``<|im_end|>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import httpx
import pytest

from tests.compaction.codex import CODEX, FALLBACK, MISSING, Codex
from tests.e2e.conftest import ENGINE_NICE, ENGINE_START_TIMEOUT, VLLM_API_KEY
from tests.sessions.helpers import metric_value
from tests.support.agent_engine import AgentProxies, agent_model
from tests.support.tiny_model import MODEL_NAME
from tests.support.vllm_stack import VllmStack

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not CODEX.exists(), reason=MISSING)]

WINDOW = 32768
BUDGET = 31000
TURNS = 6
#: A turn's hang guard: the first prefills Codex's whole prompt on two shared cores.
TURN_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    folder = tmp_path_factory.mktemp("codex-model")
    stack = VllmStack(
        agent_model(folder, WINDOW),
        max_model_len=WINDOW,
        kv_blocks=(WINDOW + 2048) // 32,
        extra_args=(
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--override-generation-config",
            '{"max_new_tokens": 12}',
        ),
        api_key=VLLM_API_KEY,
        nice=ENGINE_NICE,
        startup_timeout=ENGINE_START_TIMEOUT,
    )
    with stack:
        yield stack


def forwarded(logs: str) -> list[int]:
    return [int(n) for n in re.findall(r'"prompt_tokens_forwarded":(\d+)', logs)]


def by_status(logs: str) -> tuple[list[int], list[int]]:
    """The forwarded counts of the requests answered 200, and of the others (a request
    Codex gave up on and sent again: forwarded twice, answered once)."""
    served: list[int] = []
    others: list[int] = []
    for line in logs.splitlines():
        if '"prompt_tokens_forwarded"' in line:
            entry = json.loads(line)
            kept = served if entry["status"] == 200 else others
            kept.append(int(entry["prompt_tokens_forwarded"]))
    return served, others


def test_a_codex_session_compacts_twice_on_the_real_engine(
    tmp_path: Path, engine: VllmStack
) -> None:
    proxies = AgentProxies(engine)
    try:
        proxy = proxies.start(max_prompt_tokens=BUDGET, upstream_metrics_interval=0)
        codex = Codex.configured(tmp_path, proxy.api_base, MODEL_NAME, WINDOW, TURN_TIMEOUT)
        outputs = [codex.turn("Say hello.", first=True)]
        first = forwarded(proxy.logs())
        assert first, outputs[0].stdout[-3000:]
        codex.configure(proxy.api_base, MODEL_NAME, WINDOW, first[-1] + 50)
        outputs += [codex.turn(f"Tell me more, part {n}.", first=False) for n in range(1, TURNS)]
        for n, done in enumerate(outputs):
            assert done.returncode == 0, f"turn {n}: {done.stdout[-3000:]}"
            assert not any(line in done.stdout for line in FALLBACK), done.stdout[-3000:]
        logs = proxy.logs()
        sent = forwarded(logs)
        opened = [line for line in logs.splitlines() if "WebSocket /v1/responses" in line]
        assert len(opened) >= TURNS and all("[accepted]" in line for line in opened)
        text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
        made = metric_value(text, "trimproxy_compactions_total", form="trigger")
        print(f"\n{TURNS} turns, {made:.0f} remote compactions, forwarded {sent}")
        assert made >= 2
        assert metric_value(text, "trimproxy_compaction_items_total", outcome="expanded") >= 1
        assert max(sent) <= BUDGET
        # Every turn the engine answered (it refuses a compaction item: "Unsupported
        # input item type"), and every request it finished counted as the proxy counted
        # it: the answered ones, and any Codex gave up on that had reached it.
        served, others = by_status(logs)
        assert len(served) >= TURNS
        seen = engine.metrics()
        finished = int(seen.value("vllm:request_success_total"))
        assert len(served) <= finished <= len(sent)
        sums = {sum(c) for c in combinations(others, finished - len(served))}
        assert seen.value("vllm:request_prompt_tokens_sum") in {sum(served) + s for s in sums}
    finally:
        proxies.stop_all()
