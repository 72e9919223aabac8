"""The capacity's source (the setting, vLLM's cache_config_info) and the gate's answers."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import generate_latest

from proxy.admission import (
    Capacity,
    EngineCache,
    KvAdmission,
    MemoryLedger,
    build_admission,
    parse_cache_config,
    scaled,
    wait_header,
)
from proxy.errors import Overloaded
from proxy.metrics import Metrics
from proxy.settings import Settings

# As vLLM 0.11 writes it (V1: one series per engine); the label set is CacheConfig's.
VLLM_V1 = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",calculate_kv_scales="False",\
enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",\
num_gpu_blocks="192",num_gpu_blocks_override="None",sliding_window="None",swap_space="4"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels or None)
    return value


def test_parse_vllm_cache_config() -> None:
    assert parse_cache_config(VLLM_V1) == EngineCache(191 * 32, 32)  # less the null block


def test_parse_sums_engines_and_prefers_kv_cache_size_tokens() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="2000",'
        'num_gpu_blocks="100"} 1.0\n'
    )
    assert parse_cache_config(text) == EngineCache(99 * 16 + 2000 - 16, 16)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "vllm:num_requests_running 0.0\n",
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n',
    ],
)
def test_parse_without_figures(text: str) -> None:
    assert parse_cache_config(text) is None


def test_scaled_keeps_whole_blocks() -> None:
    assert scaled(6144, 0.9, 32) == Capacity(5504, 32)  # 5529.6 → down to a block
    assert scaled(4200, 1.0) == Capacity(4200, 1)
    assert scaled(100, 2.0, 16) == Capacity(192, 16)


def gate(metrics: Metrics, mode: str = "fixed", timeout: float = 0.05) -> KvAdmission:
    return KvAdmission(
        MemoryLedger(None),
        metrics,
        mode="auto" if mode == "auto" else "fixed",
        fraction=1.0,
        timeout=timeout,
        fixed_tokens=None if mode == "auto" else 1000,
    )


async def test_metrics_follow_reservations(metrics: Metrics) -> None:
    g = gate(metrics)
    assert sample(metrics, "trimproxy_kv_capacity_tokens") == 1000
    first = await g.admit(600)
    assert sample(metrics, "trimproxy_kv_reserved_tokens") == 600
    assert wait_header(first) == {}  # admitted at once: no header
    waiting = asyncio.ensure_future(g.admit(600))
    await asyncio.sleep(0.01)
    first.release()
    second = await waiting
    assert wait_header(second)["x-trimproxy-admission-wait-ms"].isdigit()
    assert sample(metrics, "trimproxy_kv_reserved_tokens") == 600
    second.release()
    second.release()
    assert sample(metrics, "trimproxy_kv_reserved_tokens") == 0
    assert sample(metrics, "trimproxy_admission_wait_seconds_count") == 2


async def test_timeout_is_a_429_that_names_the_settings(metrics: Metrics) -> None:
    g = gate(metrics)
    held = await g.admit(1000)
    with pytest.raises(Overloaded) as caught:
        await g.admit(10)
    error = caught.value
    assert error.status == 429 and error.code == "overloaded"
    assert error.headers["retry-after"] == "1"
    assert "TRIMPROXY_KV_ADMISSION" in error.message and "TRIMPROXY_ADMISSION_TIMEOUT" in (
        error.message
    )
    assert "1000 of 1000 tokens" in error.message
    rejected = "trimproxy_admission_rejected_total"
    assert sample(metrics, rejected, reason="timeout", endpoint="chat") == 1
    # Counted on the endpoint the request came in by.
    with pytest.raises(Overloaded):
        await g.admit(10, "messages")
    assert sample(metrics, rejected, reason="timeout", endpoint="messages") == 1
    assert sample(metrics, rejected, reason="timeout", endpoint="chat") == 1
    assert sample(metrics, rejected, reason="timeout", endpoint="completions") == 0
    held.release()


async def test_a_wait_the_client_abandons_is_counted(metrics: Metrics) -> None:
    g = gate(metrics, timeout=60)
    held = await g.admit(1000)
    waiting = asyncio.ensure_future(g.admit(10))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    labels = {"reason": "client_closed", "endpoint": "chat"}
    assert sample(metrics, "trimproxy_admission_rejected_total", **labels) == 1
    held.release()


async def test_auto_without_figures_says_so_once_and_stays_off(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    g = gate(metrics, mode="auto")
    with caplog.at_level(logging.WARNING, "trimproxy.admission"):
        for _ in range(3):
            g.observe_engine(None)
    assert len([r for r in caplog.records if "cache_config_info" in r.message]) == 1
    assert g.capacity is None
    free = await g.admit(10**6)
    assert free.charge == 0
    g.observe_engine(parse_cache_config(VLLM_V1))  # the engine now publishes its figures
    assert g.capacity == Capacity(6112, 32)
    assert sample(metrics, "trimproxy_kv_capacity_tokens") == 6112
    g.observe_engine(None)  # a failed scrape keeps the last capacity
    assert g.capacity == Capacity(6112, 32)
    g.observe_engine(EngineCache(3200, 32))  # the engine restarted smaller
    assert g.capacity == Capacity(3200, 32)


def test_build_admission_from_settings(metrics: Metrics) -> None:
    assert build_admission(Settings(), metrics) is None
    fixed = build_admission(Settings(kv_admission="4200", kv_admission_fraction=0.5), metrics)
    assert fixed is not None and fixed.capacity == Capacity(2100)
    split = build_admission(Settings(kv_admission="4200", workers=2), metrics)
    assert split is not None and split.capacity == Capacity(2100)  # each worker's share
    assert b"trimproxy_kv_capacity_tokens 4200.0" in generate_latest(metrics.registry)
    auto = build_admission(Settings(kv_admission="auto"), metrics)
    assert auto is not None and auto.capacity is None


@pytest.mark.parametrize("value", ["on", "-5", "0", "1.5"])
def test_bad_setting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="off, auto, or a positive number"):
        Settings(kv_admission=value)
