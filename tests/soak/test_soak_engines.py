"""``trimproxy soak`` over several engines: each engine's ``/metrics`` sampled on its
own, per-engine figures, and the cluster's prefix-cache hit ratio (the sum of the
engines' hit increases over the sum of their query increases).

Two simulated engines (each its own prefix cache) as child processes, and
``trimproxy serve`` in front of the first. The target arm (through the proxy) loads
engine A only, the compare arm (straight at B) engine B only, and both arms sample
both engines: every figure must land on the engine that did the work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.soak.discovery import resolve_engines
from tests.soak.support import Soak
from tests.soak.support import soak as run_soak
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream, start_sim_process

# One soak run serves the module: keep its tests on one xdist worker (--dist loadgroup),
# or each worker runs the soak again.
pytestmark = pytest.mark.xdist_group("soak_engines")

TURNS = 5
CONVERSATIONS = 2
SIM: dict[str, Any] = {"tokens_per_second": 150.0, "completion_tokens": 24,
                       "kv_blocks": 96, "block_size": 16}  # fmt: skip


def name(sim: SimUpstream) -> str:
    return sim.url.removeprefix("http://")


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimUpstream, ...]]:
    sims = tuple(start_sim_process(tmp_path_factory.mktemp(f"sim{i}"), **SIM) for i in range(2))
    yield sims
    for sim in sims:
        sim.stop()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, engines: tuple[SimUpstream, ...]) -> Soak:
    a, b = engines
    with ProxyProcess({"upstream_url": a.url}) as proxy:
        out = tmp_path_factory.mktemp("soak") / "run"
        return run_soak(out, "--model", "sim-model", "--target", proxy.url, "--compare", b.url,
                        "--engine-metrics", f"{a.url}/metrics",
                        "--engine-metrics", f"{b.url}/metrics",
                        "--conversations", str(CONVERSATIONS), "--turns", str(TURNS),
                        "--turn-tokens", "60", "--max-tokens", "24")  # fmt: skip


def test_every_sample_holds_each_engine(run: Soak, engines: tuple[SimUpstream, ...]) -> None:
    assert run.rc == 0, run.output
    names = [name(sim) for sim in engines]
    samples = run.samples()
    assert samples and all(list(s["engines"]) == names for s in samples)
    for s in samples:
        for figures in s["engines"].values():
            assert 0 <= figures["kv_usage"] <= 1
            assert figures["prefix_cache_queries_total"] >= figures["prefix_cache_hits_total"]
        # The fold at the top: the fullest engine, the counts summed.
        assert s["kv_usage"] == max(f["kv_usage"] for f in s["engines"].values())
        assert s["running"] == sum(f["running"] for f in s["engines"].values())


def test_figures_land_on_the_engine_that_did_the_work(
    run: Soak, engines: tuple[SimUpstream, ...]
) -> None:
    a, b = (name(sim) for sim in engines)
    target, compare = run.summary["target"]["engines"], run.summary["compare"]["engines"]
    assert list(target) == list(compare) == [a, b]
    # Through the proxy (upstream A): A answered every turn, B saw nothing.
    assert target[a]["prefix_cache_queries"] > 0 and target[a]["prefix_cache_hits"] > 0
    assert target[b]["prefix_cache_queries"] == 0 and target[b]["prefix_cache_hits"] == 0
    assert target[b]["prefix_cache_hit_ratio"] is None
    # Straight at B: the other way round.
    assert compare[b]["prefix_cache_queries"] > 0 and compare[a]["prefix_cache_queries"] == 0
    for figures in (target[a], compare[b]):
        assert figures["kv_usage_peak"] is not None and figures["kv_usage_peak"] > 0


def test_cluster_ratio_is_the_sum_of_the_engines_deltas(run: Soak) -> None:
    for arm in ("target", "compare"):
        samples = [s for s in run.samples() if s["arm"] == arm]
        first, last = samples[0]["engines"], samples[-1]["engines"]
        hits = sum(last[e]["prefix_cache_hits_total"] - first[e]["prefix_cache_hits_total"]
                   for e in first)  # fmt: skip
        queries = sum(last[e]["prefix_cache_queries_total"]
                      - first[e]["prefix_cache_queries_total"] for e in first)  # fmt: skip
        assert queries > 0
        summary = run.summary[arm]
        assert summary["prefix_cache_hit_ratio"] == round(hits / queries, 4)
        engines = summary["engines"].values()
        assert sum(e["prefix_cache_queries"] for e in engines) == queries


def test_report_shows_each_engine_and_the_cluster_ratio(
    run: Soak, engines: tuple[SimUpstream, ...]
) -> None:
    page = (run.out / "report.html").read_text()
    assert "<h2>Engines</h2>" in page and "Cluster prefix-cache hit ratio" in page
    ratio = run.summary["target"]["prefix_cache_hit_ratio"]
    assert f"<b>{ratio}</b>" in page
    for sim in engines:
        assert name(sim) in page
    assert page.count("<svg") >= 3
    assert (run.out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_engine_that_is_not_there_stops_the_run_before_the_load(
    tmp_path: Path, engines: tuple[SimUpstream, ...]
) -> None:
    a = engines[0]
    done = run_soak(tmp_path / "gone", "--model", "sim-model", "--target", a.url,
                    "--engine-metrics", f"{a.url}/metrics",
                    "--engine-metrics", "http://127.0.0.1:9/metrics", "--turns", "1")  # fmt: skip
    assert done.rc == 2
    assert "the engine's metrics page http://127.0.0.1:9/metrics did not answer" in done.output
    assert not (tmp_path / "gone" / "requests.jsonl").exists()


async def test_the_proxys_upstream_names_each_engine() -> None:
    # A comma list is each engine; a dns+ name every address it resolves to.
    got = await resolve_engines("http://10.0.0.1:8000/v1, http://10.0.0.2:8000,"
                                "dns+http://localhost:8001")  # fmt: skip
    assert got[:2] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert "http://127.0.0.1:8001" in got[2:]
    assert await resolve_engines("http://10.0.0.1:8000,http://10.0.0.1:8000") == [
        "http://10.0.0.1:8000"
    ]


def test_the_engines_come_from_the_proxys_readyz(
    tmp_path: Path, engines: tuple[SimUpstream, ...]
) -> None:
    # A proxy that routes over both engines: no --engine-metrics, the soak finds both
    # through /readyz, and session routing spreads the lanes over them.
    pytest.importorskip("proxy.engines.routing", reason="this proxy routes to one engine")
    a, b = engines
    with ProxyProcess({"upstream_url": f"{a.url},{b.url}"}) as proxy:
        done = run_soak(tmp_path / "readyz", "--model", "sim-model", "--target", proxy.url,
                        "--conversations", "6", "--turns", "3", "--turn-tokens", "40",
                        "--max-tokens", "16")  # fmt: skip
    assert done.rc == 0, done.output
    per_engine = done.summary["target"]["engines"]
    assert list(per_engine) == [name(a), name(b)]
    assert all(e["prefix_cache_queries"] > 0 for e in per_engine.values()), per_engine
