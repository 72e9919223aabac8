"""The response store under a hostile client, through real ``trimproxy serve``
processes in front of the simulated engine, the store in memory or in a real Redis
(docs/security.md): bounded in bytes per turn, per chain and in all, storage linear
in what was sent, one key's big chain harmless to another's, ids the proxy mints and
never overwrites, and a setting that keeps nothing.

A turn's bulk sits in an early turn of its own input, so the budget trims it from
what the engine is sent while the store keeps the input whole.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.chains.redis_store import TOTAL
from tests.conftest import StartProxy
from tests.sessions.helpers import metric_value
from tests.support.processes import ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sim import SimUpstream

MODEL = "sim-model"
MIB = 1024 * 1024
SKIPPED = "trimproxy_response_store_skipped_total"


def turn(
    proxy: ProxyProcess,
    key: str,
    bulk: int = 0,
    previous: str | None = None,
    **extra: Any,
) -> httpx.Response:
    """One Responses request of ``key``: ``bulk`` bytes in an early turn, a short last
    one, continuing ``previous``."""
    items: list[dict[str, Any]] = []
    if bulk:
        items += [
            {"role": "user", "content": "y " * (bulk // 2)},
            {"role": "assistant", "content": "ok"},
        ]
    items.append({"role": "user", "content": "and now?"})
    body: dict[str, Any] = {"model": MODEL, "input": items, "max_output_tokens": 8, **extra}
    if previous is not None:
        body["previous_response_id"] = previous
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{proxy.url}/v1/responses", json=body, headers=headers, timeout=60)


def rid(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text[:300]
    value: str = answer.json()["id"]
    return value


def metrics(proxy: ProxyProcess) -> str:
    return httpx.get(f"{proxy.url}/metrics", timeout=10).text


@pytest.mark.redis
def test_one_keys_big_chain_is_bounded_and_never_fails_another_keys(
    proxy_server: StartProxy, redis_server: RedisServer, sim_upstream: SimUpstream
) -> None:
    proxy = proxy_server(
        tokenizer="approx",
        upstream_metrics_interval=0,
        redis_url=redis_server.url,
        response_store_entry_bytes=1 * MIB,
        response_store_chain_bytes=3 * MIB,
    )
    inspect = redis_server.client()
    try:
        victim = rid(turn(proxy, "victim"))
        attacker = rid(turn(proxy, "attacker", 600_000))
        stored_ids = [attacker]
        for _ in range(5):  # 600 kB a turn: the sixth passes 3 MiB and is not stored
            stored_ids.append(rid(turn(proxy, "attacker", 600_000, stored_ids[-1])))
            victim = rid(turn(proxy, "victim", 0, victim))  # the other key goes on
        # Five turns held (about 3 MB), not the 6 x 7 / 2 x 600 kB a whole-chain
        # entry would have grown to.
        held = int(inspect.get(TOTAL) or 0)
        assert 5 * 600_000 < held < 5 * 600_000 * 1.05
        late = turn(proxy, "attacker", 0, stored_ids[5])
        assert late.status_code == 400, late.text[:300]
        error = late.json()["error"]
        assert error["code"] == "previous_response_not_found"
        assert "TRIMPROXY_RESPONSE_STORE_CHAIN_BYTES" in error["message"]
        # One turn over the entry bound: served, not stored.
        big = rid(turn(proxy, "attacker", 2 * MIB))
        assert turn(proxy, "attacker", 0, big).status_code == 400
        victim = rid(turn(proxy, "victim", 0, victim))
        text = metrics(proxy)
        assert metric_value(text, SKIPPED, reason="chain_bytes") >= 1
        assert metric_value(text, SKIPPED, reason="entry_bytes") == 1
        assert int(inspect.get(TOTAL) or 0) < held + 10_000  # the big turn is not held
    finally:
        inspect.close()


def _rss(proxy: ProxyProcess) -> int:
    with open(f"/proc/{proxy.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_memory_store_holds_at_most_its_bytes(
    proxy_server: StartProxy, sim_upstream: SimUpstream
) -> None:
    """60 one-turn chains of 2 MB under a 16 MiB bound: the oldest are evicted, the
    gauge stays under the bound, and the process's memory grows by about the bound,
    not the 120 MB sent (a decoded entry took several times its JSON)."""
    proxy = proxy_server(
        tokenizer="approx", upstream_metrics_interval=0, response_store_bytes=16 * MIB
    )
    rid(turn(proxy, "k", 100))  # warm: the first request's imports and caches
    before = _rss(proxy)
    ids = [rid(turn(proxy, "k", 2_000_000)) for _ in range(60)]
    grown = _rss(proxy) - before
    print(f"\nRSS grown by {grown / MIB:.1f} MiB for 60 x 2 MB stored under a 16 MiB bound")
    assert metric_value(metrics(proxy), "trimproxy_response_store_bytes") <= 16 * MIB
    assert turn(proxy, "k", 0, ids[0]).status_code == 400  # evicted, least recent first
    assert turn(proxy, "k", 0, ids[-1]).status_code == 200
    assert grown < 64 * MIB, grown


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_ids_are_minted_and_a_stored_turn_never_overwritten(
    kind: str, proxy_server: StartProxy, request: pytest.FixtureRequest, sim_upstream: SimUpstream
) -> None:
    extra: dict[str, Any] = {}
    if kind == "redis":
        extra["redis_url"] = request.getfixturevalue("redis_server").url
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0, **extra)
    victim = rid(turn(proxy, "team", 100))
    assert victim.startswith("resp_") and len(victim) == 53
    for stream in (False, True):
        body = {"request_id": victim, "stream": stream}
        chosen = turn(proxy, "team", 0, None, **body)
        assert chosen.status_code == 200
        assert victim not in chosen.text  # the engine's answer was renamed
    sent = [r["json"]["request_id"] for r in sim_upstream.requests("/v1/responses")]
    assert sent[0] == victim  # the id the proxy minted goes to the engine as request_id
    assert victim not in sent[1:] and len(set(sent)) == len(sent)
    # The victim's turn is still its own: retrieved and continued as it was stored.
    got = httpx.get(f"{proxy.url}/v1/responses/{victim}", headers={"authorization": "Bearer team"})
    assert got.json()["id"] == victim
    sim_upstream.clear()
    rid(turn(proxy, "team", 0, victim))
    (body,) = [r["json"] for r in sim_upstream.requests("/v1/responses")]
    assert body["input"][0]["content"].startswith("y y")  # the victim's own first turn
    # A client's request_id of "resp_1" does not become an id either, stored or not.
    assert rid(turn(proxy, "team", 0, None, request_id="resp_1")) != "resp_1"
    sim_upstream.clear()
    assert turn(proxy, "team", 0, None, request_id="resp_1", store=False).status_code == 200
    (unstored,) = [r["json"] for r in sim_upstream.requests("/v1/responses")]
    assert unstored["request_id"] != "resp_1"


def test_store_off_keeps_nothing(proxy_server: StartProxy, sim_upstream: SimUpstream) -> None:
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0, response_store=False)
    made = rid(turn(proxy, "k"))
    got = httpx.get(f"{proxy.url}/v1/responses/{made}", headers={"authorization": "Bearer k"})
    assert got.status_code == 404
    later = turn(proxy, "k", 0, made)
    assert later.status_code == 400
    assert "TRIMPROXY_RESPONSE_STORE" in later.json()["error"]["message"]
    assert metric_value(metrics(proxy), "trimproxy_response_store_entries") == 0


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_chain_whose_earlier_turn_is_gone_is_a_400_naming_the_bounds(
    kind: str, proxy_server: StartProxy, request: pytest.FixtureRequest, sim_upstream: SimUpstream
) -> None:
    extra: dict[str, Any] = {}
    if kind == "redis":
        extra["redis_url"] = request.getfixturevalue("redis_server").url
    proxy = proxy_server(tokenizer="approx", upstream_metrics_interval=0, **extra)
    first = rid(turn(proxy, "k"))
    second = rid(turn(proxy, "k", 0, first))
    third = rid(turn(proxy, "k", 0, second))
    gone = httpx.delete(f"{proxy.url}/v1/responses/{second}", headers={"authorization": "Bearer k"})
    assert gone.status_code == 200
    sim_upstream.clear()
    broken = turn(proxy, "k", 0, third)
    assert broken.status_code == 400
    error = broken.json()["error"]
    assert (error["code"], error["param"]) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    assert "TRIMPROXY_RESPONSE_STORE_BYTES" in error["message"]
    assert sim_upstream.requests("/v1/responses") == []
    assert rid(turn(proxy, "k", 0, first)) != third  # the turn before the gap goes on
