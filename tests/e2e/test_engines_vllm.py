"""Several real vLLM engines behind one trimproxy: session routing keeps each
conversation's prefix cache hitting where round robin loses it, and an engine killed
mid-load costs only the requests in flight on it (CPU build, tiny model, a KV cache that
holds an engine's share of the conversations but not all of them)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.admission_vllm import drive
from tests.observability.promtext import scrape
from tests.support.processes import ProxyProcess
from tests.support.vllm_stack import VllmStack, build_vllm_model

pytestmark = pytest.mark.vllm

# An odd number of conversations over two engines: taken in turn, round robin sends each
# conversation's next turn to the other engine (with an even number it would stick).
ENGINES, CONVERSATIONS, TURNS, BUDGET = 2, 5, 8, 600
# 72 blocks of 32 = 2,304 KV tokens an engine: its share of the sessions fits (3 x ~600),
# all five conversations (round robin's working set on every engine) do not.
KV_BLOCKS = 72
_WORDS = ("the", "river", "runs", "past", "the", "old", "mill", "and", "mountain", "road")


@pytest.fixture(scope="module")
def engines() -> Iterator[list[VllmStack]]:
    dev = {"VLLM_SERVER_DEV_MODE": "1"}  # serves POST /reset_prefix_cache
    model = build_vllm_model()
    stacks = [
        VllmStack(model, kv_blocks=KV_BLOCKS, max_model_len=2048, env=dev) for _ in range(ENGINES)
    ]
    try:
        for stack in stacks:
            stack.start()
        yield stacks
    finally:
        for stack in stacks:
            stack.stop()


def _converse(proxy: ProxyProcess, model: str, seed: str) -> list[int]:
    """The conversations one turn at a time (each turn's requests one after another);
    the statuses of every request."""
    rng = random.Random(seed)
    histories = [[{"role": "system", "content": "Answer briefly."}] for _ in range(CONVERSATIONS)]
    statuses = []
    with httpx.Client(timeout=120) as client:
        for _turn in range(TURNS):
            for i, history in enumerate(histories):
                history.append({"role": "user", "content": " ".join(rng.choices(_WORDS, k=70))})
                body = {"model": model, "messages": history, "max_tokens": 32,
                        "ignore_eos": True, "temperature": 0}  # fmt: skip
                reply = client.post(f"{proxy.api_base}/chat/completions", json=body,
                                    headers={"X-Session-ID": f"{seed}-{i}"})  # fmt: skip
                statuses.append(reply.status_code)
                content = (
                    reply.json()["choices"][0]["message"]["content"] if reply.is_success else ""
                )
                history.append({"role": "assistant", "content": content or "(none)"})
    return statuses


def _counters(engines: list[VllmStack]) -> tuple[float, float]:
    readings = [e.metrics() for e in engines]
    return sum(r.prefix_hits for r in readings), sum(r.prefix_queries for r in readings)


def test_session_routing_keeps_the_prefix_cache_that_round_robin_loses(
    engines: list[VllmStack],
) -> None:
    urls = ",".join(e.base_url for e in engines)
    ratios = {}
    for routing in ("session", "round_robin"):
        for engine in engines:
            httpx.post(f"{engine.base_url}/reset_prefix_cache", timeout=30).raise_for_status()
        settings = {"upstream_url": urls, "routing": routing, "max_prompt_tokens": BUDGET,
                    "tokenizer": f"hf:{engines[0].model_dir}"}  # fmt: skip
        with ProxyProcess(settings, startup_timeout=120.0) as proxy:
            hits, queries = _counters(engines)
            statuses = _converse(proxy, engines[0].model, routing)
            after_hits, after_queries = _counters(engines)
        assert set(statuses) == {200}, statuses
        ratios[routing] = (after_hits - hits) / (after_queries - queries)
    print(f"\ncluster prefix-cache hit ratio: {ratios}")
    assert ratios["session"] > 0.5
    assert ratios["session"] > 1.5 * ratios["round_robin"]


def test_a_killed_engine_costs_only_its_requests_in_flight(engines: list[VllmStack]) -> None:
    settings = {"upstream_url": ",".join(e.base_url for e in engines), "tokenizer": "approx",
                "health_interval": 0.5, "max_prompt_tokens": BUDGET}  # fmt: skip
    with ProxyProcess(settings, startup_timeout=120.0) as proxy:
        first = _converse(proxy, engines[0].model, "before")
        assert set(first) == {200}
        victim = engines[-1]
        assert victim.proc is not None
        victim.proc.kill()  # SIGKILL of the API server; its engine core goes with the group
        victim.proc.wait()
        victim.stop()
        after = _converse(proxy, engines[0].model, "after")
        assert set(after) == {200}, after  # nothing was in flight: every request is served
        ready = httpx.get(f"{proxy.url}/readyz", timeout=10).json()
        assert ready["engines"] == ENGINES and ready["engines_up"] == ENGINES - 1


def test_each_engine_stays_within_its_own_capacity_under_admission(
    engines: list[VllmStack],
) -> None:
    """Eight conversations at once over the two engines, ``auto`` admission: the load is
    split by session, each engine's reservations stay under its own capacity (read from
    its own /metrics), and no engine preempts."""

    live = [e for e in engines if e.proc is not None]  # the previous test killed one
    for engine in engines:
        if engine.proc is None:
            engine.start()  # restarted on a port of its own: a fresh engine
            live.append(engine)
    settings = {"upstream_url": ",".join(e.base_url for e in live), "kv_admission": "auto",
                "max_prompt_tokens": BUDGET, "admission_timeout": 600,
                "upstream_metrics_interval": 0.25,
                "tokenizer": f"hf:{live[0].model_dir}"}  # fmt: skip
    with ProxyProcess(settings, startup_timeout=120.0) as proxy:
        capacity: dict[str, float] = {}
        deadline = time.monotonic() + 60  # a hang guard
        while len(capacity) < len(live) or not all(capacity.values()):
            assert time.monotonic() < deadline, capacity
            capacity = scrape(proxy.url).by_engine("trimproxy_engine_kv_capacity_tokens")
            time.sleep(0.1)
        assert set(capacity.values()) == {(KV_BLOCKS - 1) * 32}
        peaks: dict[str, float] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for name, held in (
                    scrape(proxy.url).by_engine("trimproxy_engine_kv_reserved_tokens").items()
                ):
                    peaks[name] = max(peaks.get(name, 0.0), held)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        before = [e.metrics().preemptions for e in live]
        try:
            load = asyncio.run(drive(proxy.url, live[0].model, conversations=8, turns=3))
        finally:
            done.set()
            sampler.join()
        preempted = [e.metrics().preemptions - b for e, b in zip(live, before, strict=True)]
    print(f"\npeaks {peaks} of {capacity}; preemptions {preempted}; waited {load.waited}")
    assert load.statuses == {200: 24}, load.first_error
    assert preempted == [0] * len(live)
    assert len([p for p in peaks.values() if p > 0]) == len(live)  # the load was split
    for name, peak in peaks.items():
        assert peak <= capacity[name]
