"""The soak's numbers on synthetic records and samples: no servers, exact figures."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.soak.discovery import engine_info
from proxy.soak.options import SoakOptions, api_root
from proxy.soak.records import RequestRecord, Sample
from proxy.soak.sampler import parse_engine_metrics, parse_nvidia_smi
from proxy.soak.summary import (
    SUMMARY_FIELDS,
    arm_summary,
    counter_increase,
    percentile,
    verdict,
)
from proxy.soak.text import user_text


def record(**fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "arm": "target",
        "conversation": 0,
        "restart": 0,
        "turn": 1,
        "start": 0.0,
        "status": 200,
        "error": None,
        "error_key": None,
        "sent_prompt_tokens": None,
        "forwarded_prompt_tokens": 100,
        "usage_prompt_tokens": 100,
        "completion_tokens": 10,
        "latency_seconds": 1.0,
        "ttft_seconds": 0.1,
        "session_id": "s",
    }
    base.update(fields)
    return RequestRecord(**base)


def failure(status: int | None, key: str) -> RequestRecord:
    return record(
        status=status,
        error="boom",
        error_key=key,
        forwarded_prompt_tokens=None,
        completion_tokens=None,
        latency_seconds=0.01,
    )


def sample(t: float, **fields: Any) -> Sample:
    return Sample("target", t, 1000.0 + t, **fields)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([float(i) for i in range(1, 101)], 0.99) == pytest.approx(99.01)
    assert percentile([1.0, 2.0, 3.0], 0.0) == 1.0
    assert percentile([1.0, 2.0, 3.0], 1.0) == 3.0


def test_counter_increase_over_the_arm_survives_a_restart() -> None:
    assert counter_increase([None, None]) is None
    assert counter_increase([5.0]) == 0.0
    assert counter_increase([10.0, None, 12.0, 15.0]) == 5.0
    # The engine restarted between 15 and 2: its new count is all increase.
    assert counter_increase([10.0, 15.0, 2.0, 4.0]) == 5.0 + 2.0 + 2.0


def test_arm_summary_on_synthetic_data() -> None:
    records = [
        record(forwarded_prompt_tokens=100, completion_tokens=20, latency_seconds=1.0),
        record(forwarded_prompt_tokens=300, completion_tokens=20, latency_seconds=2.0),
        record(forwarded_prompt_tokens=200, completion_tokens=20, latency_seconds=3.0),
        failure(400, "400"),
        failure(400, "400"),
        failure(None, "transport"),
    ]
    samples = [
        sample(0.0, kv_usage=0.0, waiting=0.0, preemptions_total=3.0,
               prefix_cache_hits_total=100.0, prefix_cache_queries_total=1000.0),
        sample(0.5, kv_usage=0.5, waiting=2.0, preemptions_total=4.0,
               prefix_cache_hits_total=400.0, prefix_cache_queries_total=1500.0),
        sample(1.0, error="connection refused"),
        sample(1.5, kv_usage=1.0, waiting=1.0, preemptions_total=6.0,
               prefix_cache_hits_total=900.0, prefix_cache_queries_total=2000.0),
    ]  # fmt: skip
    summary = arm_summary(records, samples, wall_seconds=10.0)
    assert tuple(summary) == SUMMARY_FIELDS
    assert summary == {
        "requests": 6,
        "errors": 3,
        "errors_by_status": {"400": 2, "transport": 1},
        "prompt_tokens_p50": 200.0,
        "prompt_tokens_max": 300,
        "kv_usage_peak": 1.0,
        "kv_usage_mean": 0.5,
        "preemptions": 3,
        "waiting_peak": 2,
        # (900 - 100) hits of (2000 - 1000) queries during the arm.
        "prefix_cache_hit_ratio": 0.8,
        "wall_seconds": 10.0,
        "completion_tokens_per_second": 6.0,
        "latency_p50_seconds": 2.0,
        "latency_p99_seconds": 2.98,
        # These samples name no engines (written before engines were sampled one by one).
        "engines": {},
    }


def test_figures_the_engine_does_not_report_are_null() -> None:
    summary = arm_summary([record()], [sample(0.0), sample(0.5)], wall_seconds=1.0)
    for name in ("kv_usage_peak", "kv_usage_mean", "preemptions", "waiting_peak",
                 "prefix_cache_hit_ratio"):  # fmt: skip
        assert summary[name] is None, name
    empty = arm_summary([], [], wall_seconds=0.0)
    assert empty["requests"] == 0
    assert empty["prompt_tokens_p50"] is None
    assert empty["completion_tokens_per_second"] is None


def test_verdict_judges_the_target_arm_only() -> None:
    clean = arm_summary([record()], [sample(0.0, kv_usage=0.7)], 1.0)
    broken = arm_summary([failure(500, "500")], [sample(0.0, kv_usage=1.0)], 1.0)
    assert verdict({"target": clean, "compare": broken}, None) == []
    assert verdict({"target": clean, "compare": broken}, 0.7) == []
    assert verdict({"target": clean, "compare": None}, 0.69) == [
        "the target arm's KV usage peaked at 0.700 > 0.69"
    ]
    assert verdict({"target": broken, "compare": None}, None) == [
        "the target arm had 1 failed requests"
    ]
    unknown = arm_summary([record()], [sample(0.0)], 1.0)
    assert verdict({"target": unknown, "compare": None}, 0.9) == [
        "--max-kv-usage was given but the engine reported no KV usage"
    ]


VLLM_METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 128.0
vllm:cache_config_info{block_size="32",cache_dtype="auto",num_gpu_blocks="192"} 1.0
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
"""


def test_engine_metrics_parsed_across_engines() -> None:
    reading = parse_engine_metrics(VLLM_METRICS)
    assert reading.kv_usage == 0.75  # the fullest engine
    assert reading.values == {
        "vllm:num_requests_running": 5.0,
        "vllm:num_requests_waiting": 1.0,
        "vllm:num_preemptions_total": 7.0,
        "vllm:prefix_cache_hits_total": 64.0,
        "vllm:prefix_cache_queries_total": 128.0,
    }
    info = engine_info(reading, 2048).as_dict()
    assert info == {"block_size": 32, "kv_capacity_tokens": 192 * 32, "max_model_len": 2048}


def test_older_gauge_name_and_a_stated_capacity() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="10",'
        'kv_cache_size_tokens="150"} 1.0\n'
    )
    reading = parse_engine_metrics(text)
    assert reading.kv_usage == 0.5
    assert engine_info(reading, None).as_dict() == {
        "block_size": 16,
        "kv_capacity_tokens": 150,
        "max_model_len": None,
    }
    assert engine_info(None, None).as_dict() == {
        "block_size": None,
        "kv_capacity_tokens": None,
        "max_model_len": None,
    }


def test_nvidia_smi_output() -> None:
    assert parse_nvidia_smi("1024\n 2048 \n") == [1024.0, 2048.0]
    assert parse_nvidia_smi("") is None
    assert parse_nvidia_smi("[N/A]\n") is None


def test_sample_without_gpu_memory_has_no_such_field() -> None:
    assert b"gpu_memory_used_mib" not in sample(0.0).to_json()
    assert b'"gpu_memory_used_mib":[1.0]' in sample(0.0, gpu_memory_used_mib=[1.0]).to_json()


def test_user_text_is_seeded_and_about_the_size_asked() -> None:
    first = user_text(1, "0.0", 3, 200)
    assert first == user_text(1, "0.0", 3, 200)
    assert first != user_text(2, "0.0", 3, 200)
    assert first != user_text(1, "1.0", 3, 200)
    assert 800 <= len(first) <= 820  # four characters a token


def test_urls_and_arms() -> None:
    assert api_root("http://h:1/v1/") == "http://h:1"
    assert api_root("http://h:1") == "http://h:1"
    options = SoakOptions(target="http://p/v1", compare="http://e:8000/", model="m")
    assert [(a.name, a.url) for a in options.arms()] == [
        ("target", "http://p"),
        ("compare", "http://e:8000"),
    ]
    assert "api_key" not in options.describe()
    assert SoakOptions(target="t", model="m", api_key="k").headers() == {
        "Authorization": "Bearer k"
    }


def test_cluster_hit_ratio_sums_each_engines_increase() -> None:
    def engine(hits: float, queries: float, kv: float) -> dict[str, Any]:
        return {"kv_usage": kv, "running": 1.0, "waiting": 0.0, "preemptions_total": 0.0,
                "prefix_cache_hits_total": hits, "prefix_cache_queries_total": queries}  # fmt: skip

    samples = [
        sample(0.0, engines={"a:1": engine(10, 100, 0.1), "b:2": engine(0, 50, 0.2)}),
        # b's scrape failed here: that is no counter reset, b's later count is no increase.
        sample(0.5, engines={"a:1": engine(40, 200, 0.3), "b:2": {"error": "refused"}}),
        sample(1.0, engines={"a:1": engine(70, 300, 0.2), "b:2": engine(5, 100, 0.6)}),
    ]
    summary = arm_summary([record()], samples, wall_seconds=1.0)
    a, b = summary["engines"]["a:1"], summary["engines"]["b:2"]
    assert (a["prefix_cache_hits"], a["prefix_cache_queries"]) == (60, 200)
    assert (b["prefix_cache_hits"], b["prefix_cache_queries"]) == (5, 50)
    assert a["prefix_cache_hit_ratio"] == 0.3 and b["prefix_cache_hit_ratio"] == 0.1
    assert (a["kv_usage_peak"], b["kv_usage_peak"]) == (0.3, 0.6)
    assert b["kv_usage_mean"] == 0.4 and a["running_peak"] == 1
    # (60 + 5) hits of (200 + 50) queries: the cluster's, not the mean of the two ratios.
    assert summary["prefix_cache_hit_ratio"] == 0.26
