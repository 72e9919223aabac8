"""KV admission in front of the real vLLM engine (CPU build, 6,144 KV tokens).

Eight conversations at once, each growing to the 1,000-token budget with 160-token
answers, need 8 x 1,160 = 9,280 tokens of KV: more than the engine has, so vLLM preempts
when left alone (``bench/admission_vllm.py`` measures both sides). With
``TRIMPROXY_KV_ADMISSION=auto`` the proxy reads the capacity from vLLM's
``vllm:cache_config_info`` and admits only what fits: no preemption, no error.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.admission_vllm import BUDGET, drive
from tests.e2e.conftest import StartVllmProxy
from tests.sessions.helpers import metric_value
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm


def test_auto_admission_prevents_preemption(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy(kv_admission="auto", max_prompt_tokens=BUDGET, admission_timeout=600)
    metrics, _ = vllm_idle.wait_for_metrics(lambda m: m.running == 0, timeout=60)
    capacity = 0.0
    for _ in range(200):  # the first scrapes (every 0.25 s) bring the capacity
        text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
        capacity = metric_value(text, "trimproxy_kv_capacity_tokens")
        if capacity:
            break
        time.sleep(0.1)
    assert capacity == (192 - 1) * 32  # vLLM keeps one block as its null block
    before = metrics.preemptions
    load = asyncio.run(drive(proxy.url, vllm_idle.model, conversations=8, turns=3))
    preempted = vllm_idle.metrics().preemptions - before
    print(
        f"\n{len(load.latencies_s)} requests in {load.wall_s:.1f} s, {load.waited} waited, "
        f"{preempted:.0f} preemptions"
    )
    assert load.statuses == {200: 24}
    assert preempted == 0
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert metric_value(text, "trimproxy_admission_wait_seconds_count") == 24  # all admitted
    assert metric_value(text, "trimproxy_kv_reserved_tokens") == 0


def _wait_capacity(proxy_url: str) -> float:
    capacity = 0.0
    for _ in range(200):  # the first scrapes (every 0.25 s) bring the capacity
        text = httpx.get(f"{proxy_url}/metrics", timeout=5).text
        capacity = metric_value(text, "trimproxy_kv_capacity_tokens")
        if capacity:
            break
        time.sleep(0.1)
    return capacity


def _proxy_metric(proxy_url: str, name: str) -> float:
    return metric_value(httpx.get(f"{proxy_url}/metrics", timeout=5).text, name)


def test_n_answers_preempt_without_admission_and_not_with_auto(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    """8 conversations whose requests ask for n: 2. Each holds its prompt once (vLLM
    shares its full blocks) and two answers: 8 x (1,000 + 2 x 160) > 6,112 tokens."""
    results = {}
    for name, settings in (("off", {}), ("auto", {"kv_admission": "auto"})):
        proxy = start_vllm_proxy(max_prompt_tokens=BUDGET, admission_timeout=600, **settings)
        if settings:
            assert _wait_capacity(proxy.url) == (192 - 1) * 32
        vllm_idle.wait_for_metrics(lambda m: m.running == 0 and m.waiting == 0, timeout=60)
        before = vllm_idle.metrics().preemptions
        load = asyncio.run(drive(proxy.url, vllm_idle.model, conversations=8, turns=4, n=2))
        results[name] = (load, vllm_idle.metrics().preemptions - before)
        print(
            f"\nn=2, admission {name}: {len(load.latencies_s)} requests in {load.wall_s:.1f} s, "
            f"{load.errors} errors, {load.waited} waited, {results[name][1]:.0f} preemptions"
        )
    assert results["off"][1] > 0  # the load does outgrow the cache
    load, preempted = results["auto"]
    assert load.statuses == {200: 32}
    assert preempted == 0


def test_answers_without_max_tokens_overrun_unless_capped(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    """The same clients sending no max_tokens, streamed, answers that never stop
    (ignore_eos: each runs to the context window). Without the cap each answer reserves
    the default 512 and runs past it: the overruns are counted and the reservations grow.
    With TRIMPROXY_MAX_COMPLETION_TOKENS every answer is held to its reservation."""
    outcome = {}
    for name, settings in (("no cap", {}), ("cap 300", {"max_completion_tokens": 300})):
        proxy = start_vllm_proxy(
            kv_admission="auto", max_prompt_tokens=BUDGET, admission_timeout=600, **settings
        )
        assert _wait_capacity(proxy.url) == (192 - 1) * 32
        vllm_idle.wait_for_metrics(lambda m: m.running == 0 and m.waiting == 0, timeout=60)
        before = vllm_idle.metrics().preemptions
        load = asyncio.run(
            drive(proxy.url, vllm_idle.model, conversations=8, turns=2, max_tokens=None,
                  stream=True)
        )  # fmt: skip
        preempted = vllm_idle.metrics().preemptions - before
        overruns = _proxy_metric(proxy.url, "trimproxy_admission_overrun_total")
        over_tokens = _proxy_metric(proxy.url, "trimproxy_admission_overrun_tokens_total")
        outcome[name] = (load, preempted, overruns)
        print(
            f"\nno max_tokens, {name}: {len(load.latencies_s)} requests in {load.wall_s:.1f} s, "
            f"{load.errors} errors, {preempted:.0f} preemptions, {overruns:.0f} overruns "
            f"({over_tokens:.0f} tokens past their reservations)"
        )
        assert _proxy_metric(proxy.url, "trimproxy_kv_reserved_tokens") == 0
    load, _, overruns = outcome["no cap"]
    assert load.statuses == {200: 16}
    assert overruns == 16  # every answer ran past the default reserve, and was counted
    load, preempted, overruns = outcome["cap 300"]
    assert load.statuses == {200: 16}
    assert (preempted, overruns) == (0, 0)
