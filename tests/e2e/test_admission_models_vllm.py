"""KV admission with a models file: two models on two engines, each admitted against
its own capacity. One is the real vLLM engine (6,144 KV tokens), the other the sim
(a cache of its own size); both loads run at once through one trimproxy."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.admission_vllm import BUDGET, LoadResult, drive
from tests.e2e.conftest import StartVllmProxy
from tests.observability.promtext import scrape
from tests.support.sim import start_sim_thread
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

SIM_BLOCKS, SIM_BLOCK = 64, 16  # 1,024 tokens: the sim's own, smaller, capacity


def test_each_model_is_admitted_against_its_own_engine(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, tmp_path: Path
) -> None:
    sim = start_sim_thread(
        "vllm", kv_blocks=SIM_BLOCKS, block_size=SIM_BLOCK, tokens_per_second=400.0
    )
    try:
        models = tmp_path / "models.toml"
        models.write_text(
            f'[models."sim-model"]\nupstream_url = "{sim.url}"\ntokenizer = "approx"\n'
            "max_prompt_tokens = 600\n"
        )
        proxy = start_vllm_proxy(kv_admission="auto", max_prompt_tokens=BUDGET,
                                 admission_timeout=600, models_file=str(models))  # fmt: skip
        vllm_engine = vllm_idle.base_url.removeprefix("http://")
        sim_engine = sim.url.removeprefix("http://")
        capacity: dict[str, float] = {}
        deadline = time.monotonic() + 60  # a hang guard: the scrapes run every 0.25 s
        while set(capacity) != {vllm_engine, sim_engine} or not all(capacity.values()):
            assert time.monotonic() < deadline, capacity
            capacity = scrape(proxy.url).by_engine("trimproxy_engine_kv_capacity_tokens")
            time.sleep(0.1)
        assert capacity[vllm_engine] == (192 - 1) * 32  # vLLM keeps one null block
        assert capacity[sim_engine] == (SIM_BLOCKS - 1) * SIM_BLOCK

        peaks: dict[str, float] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for engine, held in (
                    scrape(proxy.url).by_engine("trimproxy_engine_kv_reserved_tokens").items()
                ):
                    peaks[engine] = max(peaks.get(engine, 0.0), held)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        before = vllm_idle.metrics().preemptions

        async def both() -> tuple[LoadResult, LoadResult]:
            return await asyncio.gather(
                drive(proxy.url, vllm_idle.model, conversations=8, turns=3),
                drive(proxy.url, "sim-model", conversations=6, turns=3, user_words=120,
                      max_tokens=100),
            )  # fmt: skip

        real, simulated = asyncio.run(both())
        done.set()
        sampler.join()
        preempted = vllm_idle.metrics().preemptions - before
        print(f"\npeaks reserved {peaks} of {capacity}; vLLM preemptions {preempted:.0f}")
        assert real.statuses == {200: 24}, real.first_error
        assert simulated.statuses == {200: 18}, simulated.first_error
        assert preempted == 0
        for engine, peak in peaks.items():
            assert peak <= capacity[engine], (engine, peak, capacity)
        assert peaks.get(vllm_engine, 0) > 0 and peaks.get(sim_engine, 0) > 0
        sim_text = sim.metrics()
        assert "vllm:num_preemptions_total" in sim_text
        assert all(
            s.value == 0
            for f in text_string_to_metric_families(sim_text)
            for s in f.samples
            if s.name == "vllm:num_preemptions_total"
        )
    finally:
        sim.stop()
