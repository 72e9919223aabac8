"""The sim's prefix cache, prefill time and preemption over HTTP, on a real socket:
what a client (and trimproxy's scrape) sees in answers, ``/_sim/requests`` and
``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.sim import SimConfig, build_app
from proxy.sim.clock import Clock, StepClock
from proxy.sim.state import STATE, SimState

CHAT = "/v1/chat/completions"


class Sim:
    def __init__(self, runner: web.AppRunner, url: str, http: aiohttp.ClientSession) -> None:
        self.runner, self.url, self.http = runner, url, http

    @property
    def state(self) -> SimState:
        return self.runner.app[STATE]

    async def chat(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = {"model": "sim-model", "messages": messages, **extra}
        async with self.http.post(self.url + CHAT, json=body) as resp:
            assert resp.status == 200, await resp.text()
            answer: dict[str, Any] = orjson.loads(await resp.read())
            return answer

    async def last_record(self) -> dict[str, Any]:
        async with self.http.get(self.url + "/_sim/requests", params={"path": CHAT}) as resp:
            records: list[dict[str, Any]] = await resp.json()
        return records[-1]

    async def metric(self, name: str) -> float:
        async with self.http.get(self.url + "/metrics") as resp:
            text = await resp.text()
        samples = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]
        assert samples, f"{name} not in /metrics"
        return sum(samples)


StartSim = Callable[..., Awaitable[Sim]]


@pytest.fixture
async def sim() -> AsyncIterator[StartSim]:
    """``await sim(clock=None, **SimConfig fields) -> Sim``."""
    started: list[Sim] = []

    async def start(*, clock: Clock | None = None, **config: Any) -> Sim:
        runner = web.AppRunner(build_app(SimConfig(**config), clock), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        started.append(Sim(runner, url, aiohttp.ClientSession()))
        return started[-1]

    yield start
    for s in started:
        await s.http.close()
        await s.runner.cleanup()


def user(i: int, words: int = 30) -> dict[str, Any]:
    return {"role": "user", "content": " ".join(f"turn{i}word{j}" for j in range(words))}


async def test_a_conversation_hits_its_earlier_turns_and_answers(sim: StartSim) -> None:
    s = await sim(block_size=16)
    messages = [{"role": "system", "content": "Be brief."}, user(0)]
    first = await s.chat(messages)
    assert (await s.last_record())["cached_tokens"] == 0
    previous = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    messages += [first["choices"][0]["message"], user(1)]
    second = await s.chat(messages)
    hit = (await s.last_record())["cached_tokens"]
    # Every full block of turn one, its answer included (vLLM caches decode blocks
    # too), comes from the cache: all of them but a partial last one.
    assert hit == previous // 16 * 16
    prompt = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert await s.metric("vllm:prefix_cache_queries_total") == prompt
    assert await s.metric("vllm:prefix_cache_hits_total") == hit


async def test_metrics_are_counters_with_vllm_labels(sim: StartSim) -> None:
    s = await sim()
    await s.chat([user(0)])
    async with s.http.get(s.url + "/metrics") as resp:
        text = await resp.text()
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"):
        assert f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text
        assert f'{name}_total{{engine="0",model_name="sim-model"}}' in text


async def test_reset_prefix_cache_forgets_every_block(sim: StartSim) -> None:
    s = await sim()
    messages = [user(0, words=60)]
    await s.chat(messages)
    await s.chat(messages)
    assert (await s.last_record())["cached_tokens"] > 0
    async with s.http.post(s.url + "/reset_prefix_cache") as resp:
        assert resp.status == 200 and await resp.json() == {"success": True}
    await s.chat(messages)
    assert (await s.last_record())["cached_tokens"] == 0


async def test_no_prefix_caching_means_no_hits(sim: StartSim) -> None:
    s = await sim(prefix_caching=False)
    for _ in range(2):
        await s.chat([user(0)])
    assert (await s.last_record())["cached_tokens"] == 0
    assert await s.metric("vllm:prefix_cache_queries_total") > 0


async def test_ttft_of_a_cached_prompt_saves_its_prefill_time(sim: StartSim) -> None:
    rate = 2000.0
    s = await sim(clock=StepClock(), delay_seconds=0.05, prefill_tokens_per_second=rate)
    fresh = [user(0, words=120)]
    same_length = [user(1, words=120)]  # same byte length, other text
    await s.chat(same_length)  # nothing of it is cached
    fresh_record = await s.last_record()
    await s.chat(fresh)
    await s.chat(fresh)  # now fully cached but the last block
    cached_record = await s.last_record()
    assert fresh_record["prompt_tokens"] == cached_record["prompt_tokens"]
    prefill = cached_record["prompt_tokens"] / rate
    saved = fresh_record["ttft_seconds"] - cached_record["ttft_seconds"]
    assert abs(saved - prefill) <= 0.1 * prefill
    assert cached_record["ttft_seconds"] >= 0.05  # the fixed overhead stays


async def test_decode_slows_down_as_the_batch_grows(sim: StartSim) -> None:
    cfg = SimConfig(tokens_per_second=50, decode_batch_slowdown=0.1)
    assert cfg.decode_interval(1) == pytest.approx(0.02)
    assert cfg.decode_interval(11) == pytest.approx(0.04)
    assert SimConfig().decode_interval(5) == 0.0


async def test_an_overcommitting_load_preempts_and_every_request_finishes(
    sim: StartSim,
) -> None:
    # 40 blocks of 4 tokens; 8 requests of ~35 prompt + 40 generated tokens would
    # need ~150 blocks, but each starts on its prompt's blocks alone.
    s = await sim(
        clock=StepClock(), preempt=True, kv_blocks=40, block_size=4, tokens_per_second=100,
        completion_tokens=40, prefix_caching=False,
    )  # fmt: skip
    answers = await asyncio.gather(*(s.chat([user(i, words=12)]) for i in range(8)))
    assert [a["usage"]["completion_tokens"] for a in answers] == [40] * 8
    preempted = await s.metric("vllm:num_preemptions_total")
    assert preempted > 0, preempted
    async with s.http.get(s.url + "/_sim/requests", params={"path": CHAT}) as resp:
        records = await resp.json()
    assert sum(r["preemptions"] for r in records) == preempted
    assert all(r["status"] == 200 and not r["disconnected"] for r in records)
    state = s.state.describe()
    assert (state["running"], state["waiting"], state["kv_used_blocks"]) == (0, 0, 0)


async def test_the_default_admission_never_preempts(sim: StartSim) -> None:
    s = await sim(
        clock=StepClock(), kv_blocks=40, block_size=4, tokens_per_second=100,
        completion_tokens=40,
    )  # fmt: skip
    answers = await asyncio.gather(*(s.chat([user(i, words=12)]) for i in range(8)))
    assert [a["usage"]["completion_tokens"] for a in answers] == [40] * 8
    assert await s.metric("vllm:num_preemptions_total") == 0
