"""The sim against the real vLLM CPU engine: the ``/metrics`` series trimproxy reads
have the same names, types and labels, and one 30-turn conversation through
trimproxy gets the same prefix-cache hit ratio from both (same block size, a cache
large enough for the conversation), within 0.05."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy import vllm_metrics
from tests.conftest import StartProxy, StartSim
from tests.e2e.conftest import StartVllmProxy
from tests.e2e.test_vllm import SYSTEM, chat, user
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

TURNS = 30
BUDGET = 900
MAX_TOKENS = 16

#: The series trimproxy reads (``proxy/vllm_metrics.py``) and the token counters.
SERIES = (
    "vllm:kv_cache_usage_perc",
    vllm_metrics.RUNNING,
    vllm_metrics.WAITING,
    vllm_metrics.PREEMPTIONS,
    vllm_metrics.PREFIX_HITS,
    vllm_metrics.PREFIX_QUERIES,
    vllm_metrics.CACHE_CONFIG_INFO,
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def shapes(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Sample name -> (family type, label names), for the series above."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SERIES:
                found[sample.name] = (family.type, frozenset(sample.labels))
    return found


def test_sim_metrics_have_vllms_names_types_and_labels(
    vllm_idle: VllmStack, sim_upstream_factory: StartSim
) -> None:
    sim = sim_upstream_factory(model=vllm_idle.model, block_size=vllm_idle.block_size)
    real = shapes(vllm_idle.metrics_text())
    ours = shapes(httpx.get(f"{sim.url}/metrics").text)
    assert set(real) == set(SERIES), set(SERIES) - set(real)
    assert set(ours) == set(SERIES), set(SERIES) - set(ours)
    for name in SERIES:
        real_type, real_labels = real[name]
        our_type, our_labels = ours[name]
        assert our_type == real_type, name
        if name == vllm_metrics.CACHE_CONFIG_INFO:
            # vLLM lists its whole CacheConfig; the sim the figures trimproxy reads.
            assert our_labels <= real_labels and {"block_size", "num_gpu_blocks"} <= our_labels
        else:
            assert our_labels == real_labels, name


def _conversation(base_url: str, model: str) -> None:
    history: list[dict[str, Any]] = [SYSTEM]
    for turn in range(1, TURNS + 1):
        history.append(user(turn, seed=27))
        answer = chat(base_url, history, model=model, temperature=0.0, max_tokens=MAX_TOKENS)
        assert answer.status == 200, (turn, answer.body)
        history.append({"role": "assistant", "content": answer.content})


def _counters(text: str) -> tuple[float, float]:
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return values[vllm_metrics.PREFIX_HITS], values[vllm_metrics.PREFIX_QUERIES]


def test_one_conversation_hits_the_sim_as_it_hits_vllm(
    vllm_idle: VllmStack,
    start_vllm_proxy: StartVllmProxy,
    sim_upstream_factory: StartSim,
    proxy_server: StartProxy,
) -> None:
    httpx.post(f"{vllm_idle.base_url}/reset_prefix_cache", headers=vllm_idle.headers())
    before = _counters(vllm_idle.metrics_text())
    _conversation(start_vllm_proxy(max_prompt_tokens=BUDGET).url, vllm_idle.model)
    vllm_idle.wait_for_metrics(lambda m: m.running == 0)
    after = _counters(vllm_idle.metrics_text())
    real = (after[0] - before[0]) / (after[1] - before[1])

    sim = sim_upstream_factory(
        model=vllm_idle.model,
        block_size=vllm_idle.block_size,
        kv_blocks=vllm_idle.kv_blocks or 192,
        completion_tokens=MAX_TOKENS,
    )
    proxy = proxy_server(upstream=sim, max_prompt_tokens=BUDGET)
    _conversation(proxy.url, vllm_idle.model)
    hits, queries = _counters(httpx.get(f"{sim.url}/metrics").text)
    ours = hits / queries
    print(f"\nprefix-cache hit ratio over {TURNS} turns: vLLM {real:.3f}, sim {ours:.3f}")
    assert abs(real - ours) <= 0.05
