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
