"""``trimproxy soak`` run the way operators run it, against real processes: the
simulated vLLM engine and ``trimproxy serve`` in front of it.

One sim and one proxy serve the module. The proxy resets sessions every 3 user
turns, so the target arm's forwarded prompts must fall back to their first size
(the sawtooth) while the compare arm, straight at the engine, keeps growing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.soak.summary import SUMMARY_FIELDS
from tests.soak.support import Soak, assert_sawtooth
from tests.soak.support import soak as run_soak
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream, start_sim_process

# One soak run serves the module: keep its tests on one xdist worker (--dist loadgroup),
# or each worker runs the soak again.
pytestmark = pytest.mark.xdist_group("soak_sim")

MAX_TURNS = 3
TURNS = 7
CONVERSATIONS = 3
# Slow enough that a 0.5 s sampler sees the cache in use, fast enough for a few seconds.
SIM: dict[str, Any] = {
    "tokens_per_second": 150.0,
    "completion_tokens": 32,
    "kv_blocks": 96,
    "block_size": 16,
}


def soak(out: Path, *args: str) -> Soak:
    return run_soak(out, "--model", "sim-model", *args)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimUpstream]:
    sim = start_sim_process(tmp_path_factory.mktemp("sim"), **SIM)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def proxy(engine: SimUpstream) -> Iterator[ProxyProcess]:
    settings = {"upstream_url": engine.url, "session_max_turns": MAX_TURNS}
    with ProxyProcess(settings) as server:
        yield server


@pytest.fixture(scope="module")
def both_arms(
    tmp_path_factory: pytest.TempPathFactory, proxy: ProxyProcess, engine: SimUpstream
) -> Soak:
    out = tmp_path_factory.mktemp("soak") / "run"
    return soak(out, "--target", proxy.url, "--compare", engine.url,
                "--conversations", str(CONVERSATIONS), "--turns", str(TURNS),
                "--turn-tokens", "60", "--max-tokens", "32", "--max-kv-usage", "1")  # fmt: skip


def test_writes_every_file_with_the_summary_fields(both_arms: Soak) -> None:
    assert both_arms.rc == 0, both_arms.output
    for name in ("requests.jsonl", "samples.jsonl", "summary.json", "report.html", "report.png"):
        assert (both_arms.out / name).is_file(), name
    summary = both_arms.summary
    assert set(summary) == {"target", "compare", "engine"}
    for arm in ("target", "compare"):
        assert tuple(summary[arm]) == SUMMARY_FIELDS
        assert summary[arm]["requests"] == CONVERSATIONS * TURNS
        assert summary[arm]["errors"] == 0
        assert summary[arm]["errors_by_status"] == {}
        assert 0 < summary[arm]["kv_usage_peak"] <= 1
        assert summary[arm]["latency_p50_seconds"] > 0
    # The sim reports its window on /v1/models and its geometry as vLLM V1 does, in
    # vllm:cache_config_info (96 blocks of 16 tokens: the fixture's small cache).
    assert summary["engine"] == {"block_size": 16, "kv_capacity_tokens": 1536,
                                 "max_model_len": 4096}  # fmt: skip
    # The sim queues instead of preempting and says so (a counter at 0); its prefix
    # cache counts as vLLM's, and multi-turn conversations hit it.
    assert summary["target"]["preemptions"] == 0
    assert 0 < summary["target"]["prefix_cache_hit_ratio"] <= 1


def test_records_and_samples(both_arms: Soak) -> None:
    rows = both_arms.requests()
    assert len(rows) == 2 * CONVERSATIONS * TURNS
    for row in rows:
        assert row["status"] == 200 and row["error"] is None
        assert row["usage_prompt_tokens"] > 0 and row["completion_tokens"] == 32
        assert row["ttft_seconds"] is not None and row["ttft_seconds"] <= row["latency_seconds"]
    # What the engine counted is what the proxy says it forwarded.
    for row in both_arms.requests("target"):
        assert row["forwarded_prompt_tokens"] == row["usage_prompt_tokens"]
        assert row["session_id"].startswith("soak-")
    samples = both_arms.samples()
    assert {s["arm"] for s in samples} == {"target", "compare"}
    assert all(s["kv_usage"] is not None for s in samples)
    gpu = shutil.which("nvidia-smi") is not None
    assert all(("gpu_memory_used_mib" in s) == gpu for s in samples)


def test_target_arm_saws_back_to_its_start_after_each_reset(both_arms: Soak) -> None:
    assert_sawtooth(both_arms, CONVERSATIONS, TURNS, MAX_TURNS)
    # Straight at the engine, every conversation only grows.
    for lane in range(CONVERSATIONS):
        grown = [r["forwarded_prompt_tokens"] for r in both_arms.lane("compare", lane)]
        assert grown == sorted(grown) and len(set(grown)) == TURNS
        target = [r["forwarded_prompt_tokens"] for r in both_arms.lane("target", lane)]
        assert max(target) < grown[-1]


def test_report_is_one_offline_page(both_arms: Soak) -> None:
    page = (both_arms.out / "report.html").read_text()
    assert page.count("<svg") >= 2
    for needle in ("<script", "<link", 'src="http', "@import"):
        assert needle not in page
    assert "prompt_tokens_p50" in page
    assert (both_arms.out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kv_gate_fails_the_run(tmp_path: Path, proxy: ProxyProcess) -> None:
    # No --compare: the engine's /metrics is found through the proxy's /readyz.
    # Answers of 32 tokens at 150 a second: the sampler sees the cache in use.
    run = soak(tmp_path / "gate", "--target", proxy.url, "--conversations", "2",
               "--turns", "6", "--turn-tokens", "60", "--max-kv-usage", "0")  # fmt: skip
    assert run.rc == 1, run.output
    assert run.summary["compare"] is None
    assert run.summary["target"]["errors"] == 0
    assert "KV usage peaked at" in run.output


def test_errors_in_the_target_arm_fail_the_run(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Straight at an engine whose window the conversations outgrow by turn 3.
    small = start_sim_process(tmp_path_factory.mktemp("small"), max_model_len=300)
    try:
        run = soak(tmp_path / "errors", "--target", small.url, "--conversations", "2",
                   "--turns", "5", "--turn-tokens", "60", "--max-tokens", "16")  # fmt: skip
    finally:
        small.stop()
    assert run.rc == 1, run.output
    target = run.summary["target"]
    assert target["errors"] > 0 and set(target["errors_by_status"]) == {"400"}
    assert "failed requests" in run.output
    # A failed conversation is over: the lane starts a new one.
    restarted = [r for r in run.requests() if r["restart"] > 0]
    assert restarted and restarted[0]["turn"] == 1


def test_no_metrics_to_be_found_says_which_flag(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fastchat = start_sim_process(tmp_path_factory.mktemp("fc"), dialect="fastchat")
    try:
        run = soak(tmp_path / "none", "--target", fastchat.url, "--turns", "1")
        assert run.rc == 2
        assert "--metrics-url" in run.output
        assert not (tmp_path / "none" / "summary.json").exists()
        # FastChat has no /metrics: --metrics-url none runs on GPU memory alone.
        run = soak(tmp_path / "gpu-only", "--target", fastchat.url, "--turns", "2",
                   "--conversations", "2", "--metrics-url", "none")  # fmt: skip
    finally:
        fastchat.stop()
    assert run.rc == 0, run.output
    assert run.summary["target"]["requests"] == 4
    assert run.summary["target"]["kv_usage_peak"] is None
