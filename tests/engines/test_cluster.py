"""Three simulated engines behind one real trimproxy: routing, failover, rejoining.

Every test talks HTTP: the engines are ``proxy.sim`` servers on 127.0.0.1, the proxy is
``trimproxy serve`` in a child process, and which engine served a request is read from
the engines' own request records and the proxy's access log.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.observability.promtext import parse
from tests.support.processes import ProxyProcess, free_port
from tests.support.sim import SimProcess, SimUpstream, sim_threads

SETTINGS = {"upstream_metrics_interval": 0, "tokenizer": "approx", "health_interval": 0.5}


@pytest.fixture
def sims() -> Iterator[list[SimUpstream]]:
    with sim_threads(3) as engines:
        yield engines


def chat(base: str, session: str, turn: int) -> httpx.Response:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"turn {turn} of {session}"}],
        "max_tokens": 8,
    }
    return httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={"x-session-id": session}, timeout=30
    )


def sessions_seen(sim: SimUpstream) -> list[str]:
    return [
        next((v for k, v in r["headers"] if k.lower() == "x-session-id"), "")
        for r in sim.chat_requests()
    ]


def test_session_routing_keeps_each_session_on_one_engine_across_two_proxies(
    sims: list[SimUpstream],
) -> None:
    settings = {**SETTINGS, "upstream_url": ",".join(s.url for s in sims)}
    with ProxyProcess(settings) as first, ProxyProcess(settings) as second:
        for turn in range(3):
            for i in range(9):
                proxy = first if turn % 2 == 0 else second
                r = chat(proxy.url, f"s{i}", turn)
                assert r.status_code == 200, r.text
    where: dict[str, set[int]] = {}
    for index, sim in enumerate(sims):
        for session in sessions_seen(sim):
            where.setdefault(session, set()).add(index)
    assert sorted(where) == [f"s{i}" for i in range(9)]
    assert all(len(engines) == 1 for engines in where.values()), where
    assert len({next(iter(e)) for e in where.values()}) > 1  # not all on one engine


def test_round_robin_spreads_one_session(sims: list[SimUpstream]) -> None:
    settings = {**SETTINGS, "upstream_url": ",".join(s.url for s in sims), "routing": "round_robin"}
    with ProxyProcess(settings) as proxy:
        for turn in range(6):
            assert chat(proxy.url, "one", turn).status_code == 200
        models = httpx.get(f"{proxy.url}/v1/models", timeout=10).json()
        ready = httpx.get(f"{proxy.url}/readyz", timeout=10).json()
    assert [len(sessions_seen(s)) for s in sims] == [2, 2, 2]
    assert [m["id"] for m in models["data"]] == ["sim-model"]
    assert ready["engines"] == 3 and ready["engines_up"] == 3


def access_engines(proxy: ProxyProcess) -> list[dict[str, Any]]:
    out = []
    for line in proxy.logs().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            record.get("logger") == "trimproxy.access"
            and record.get("path") == "/v1/chat/completions"
        ):
            out.append(record)
    return out


def access_lines_after(proxy: ProxyProcess, before: int, count: int) -> list[dict[str, Any]]:
    """The chat access lines after the first ``before``, once ``count`` of them are in
    the log (each is written just after its answer)."""
    deadline = time.monotonic() + 30  # a hang guard, not a measurement
    while len(lines := access_engines(proxy)[before:]) < count:
        assert time.monotonic() < deadline, proxy.logs()[-3000:]
        time.sleep(0.05)
    return lines


def served_by(proxy: ProxyProcess, names: list[str], turn: int) -> dict[str, str]:
    """One turn of each session in ``names``, one after the other: the engine that
    served each (its access line)."""
    before = len(access_engines(proxy))
    for name in names:
        r = chat(proxy.url, name, turn)
        assert r.status_code == 200, r.text
    lines = access_lines_after(proxy, before, len(names))
    assert len(lines) == len(names)
    return dict(zip(names, (line["engine"] for line in lines), strict=True))


def wait_in_rotation(proxy: ProxyProcess, label: str) -> None:
    """Until the proxy's prober has put the engine back (``trimproxy_engine_up``)."""
    deadline = time.monotonic() + 30
    while (
        parse(httpx.get(f"{proxy.url}/metrics", timeout=10)).value(
            "trimproxy_engine_up", engine=label
        )
        != 1
    ):
        assert time.monotonic() < deadline, proxy.logs()[-3000:]
        time.sleep(0.1)


def test_failover_rejoin_and_all_down(tmp_path: Path) -> None:
    engines = [SimProcess(tmp_path, free_port()) for _ in range(3)]
    try:
        for engine in engines:
            engine.start()
        settings = {**SETTINGS, "upstream_url": ",".join(e.url for e in engines)}
        with ProxyProcess(settings) as proxy:
            names = [f"c{i}" for i in range(12)]

            def round_of(turn: int) -> dict[str, str]:
                return served_by(proxy, names, turn)

            first = round_of(0)
            assert round_of(1) == first
            victim = engines[0]
            label = victim.url.removeprefix("http://")
            assert label in first.values()
            victim.kill()
            after = round_of(2)
            # No wait: the request that was refused took the engine out before its
            # retry was answered (docs/architecture.md §20, Dispatch).
            down = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert (
                down.value("trimproxy_engine_up", engine=label) == 0
            )  # every request succeeds: refused connections fail over
            for name in names:
                if first[name] != label:
                    assert after[name] == first[name], name  # the others stayed
                else:
                    assert after[name] != label
            victim.start()  # on its old address
            assert httpx.get(f"{proxy.url}/readyz", timeout=10).json()["engines_up"] == 3
            wait_in_rotation(proxy, label)
            # It rejoins. Sessions stay where they are now (their prefix is cached there),
            # except what the bound sheds: an engine over (1 + 0.25) x the mean of 4
            # sessions gives up exactly its excess, and a new session finds room on it.
            rejoined = round_of(3)
            bound = 1.25 * len(names) / 3
            before_rejoin = Counter(after.values())
            moved = [n for n in names if rejoined[n] != after[n]]
            excess = sum(max(0, int(held - bound)) for held in before_rejoin.values())
            assert len(moved) == excess, (after, rejoined)
            held = Counter(rejoined.values())
            assert held[label] >= 1 and max(held.values()) <= bound, held
            names = ["new"]
            assert round_of(4) == {"new": label}

            for engine in engines:
                engine.kill()
            # Requests that find an engine still in the rotation get its 502; once every
            # engine is out (refused connections, failed probes), 503.
            answers = []
            for _ in range(40):
                answers.append(chat(proxy.url, "late", 9))
                if answers[-1].status_code == 503:
                    break
                time.sleep(0.05)
            last = answers[-1]
            assert last.status_code == 503, [a.status_code for a in answers]
            assert {a.status_code for a in answers[:-1]} <= {502}
            assert last.json()["error"]["code"] == "no_engine_available"
            assert int(last.headers["retry-after"]) >= 1
    finally:
        for engine in engines:
            engine.stop()


def test_a_refused_connection_takes_the_engine_out_before_its_retry_is_answered(
    tmp_path: Path,
) -> None:
    """The request that finds an engine's port closed takes the engine out of the
    rotation itself (docs/architecture.md §20, Dispatch), before its retry on the
    next engine is answered: not the next health probe, which here comes a minute after
    the one at start-up. The sessions it led go straight to their next engine after."""
    engines = [SimProcess(tmp_path, free_port()) for _ in range(2)]
    try:
        for engine in engines:
            engine.start()
        settings = {
            **SETTINGS,
            "upstream_url": ",".join(e.url for e in engines),
            "health_interval": 60,
        }
        with ProxyProcess(settings) as proxy:
            names = [f"r{i}" for i in range(12)]
            first = served_by(proxy, names, 0)
            label = first[names[0]]
            victim, other = engines if engines[0].url == f"http://{label}" else engines[::-1]
            led = [name for name in names if first[name] == label]
            refused = f"engine {label} could not be reached; retrying on"
            victim.kill()
            r = chat(proxy.url, led[0], 1)
            assert r.status_code == 200, r.text
            # Recorded before the retry went out, so before this answer: no wait.
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert page.value("trimproxy_engine_up", engine=label) == 0, proxy.logs()[-3000:]
            assert f"engine {label} left the rotation (connect)" in proxy.logs()
            after = served_by(proxy, led, 2)
            assert set(after.values()) == {other.url.removeprefix("http://")}, after
            assert proxy.logs().count(refused) == 1, proxy.logs()[-3000:]
    finally:
        for engine in engines:
            engine.stop()


def test_a_lone_engine_that_refused_a_connection_is_up_once_it_answers(tmp_path: Path) -> None:
    """An upstream of one URL has nothing to fail over to and no prober to put its
    engine back (docs/architecture.md §20): a refused connection is that request's 502
    and reads 0 on ``trimproxy_engine_up``, and the next request that the engine
    answers puts it back at 1, so it does not read 0 for good."""
    engine = SimProcess(tmp_path, free_port())
    try:
        engine.start()
        label = engine.url.removeprefix("http://")
        with ProxyProcess({**SETTINGS, "upstream_url": engine.url}) as proxy:
            assert chat(proxy.url, "one", 0).status_code == 200
            engine.kill()
            assert chat(proxy.url, "one", 1).status_code == 502
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert page.value("trimproxy_engine_up", engine=label) == 0
            assert f"engine {label} is down (connect)" in proxy.logs()
            engine.start()  # on its old address
            r = chat(proxy.url, "one", 2)
            assert r.status_code == 200, r.text
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert page.value("trimproxy_engine_up", engine=label) == 1, proxy.logs()[-3000:]
    finally:
        engine.stop()


def test_a_lone_engine_the_proxys_own_call_found_down_is_up_once_it_answers(
    tmp_path: Path,
) -> None:
    """A readiness check is the proxy's own call (``GET /v1/models``): refused, it
    marks the one engine down before any chat request was sent; the next call that
    reaches it, a readiness check again, with no chat request between, marks it up
    (docs/architecture.md §20)."""
    engine = SimProcess(tmp_path, free_port())
    label = engine.url.removeprefix("http://")
    try:
        with ProxyProcess({**SETTINGS, "upstream_url": engine.url}) as proxy:
            assert httpx.get(f"{proxy.url}/readyz", timeout=10).status_code == 503
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert page.value("trimproxy_engine_up", engine=label) == 0
            assert chat(proxy.url, "one", 0).status_code == 502
            engine.start()
            ready = httpx.get(f"{proxy.url}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            page = parse(httpx.get(f"{proxy.url}/metrics", timeout=10))
            assert page.value("trimproxy_engine_up", engine=label) == 1, proxy.logs()[-3000:]
            assert chat(proxy.url, "one", 1).status_code == 200
    finally:
        engine.stop()
