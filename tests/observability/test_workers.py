"""``TRIMPROXY_WORKERS=2``: prometheus-client's multiprocess mode, as served for real.

Any worker may answer a scrape, and each answer must hold every worker's counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.mmap_dict import MmapedDict

from tests.observability.promtext import scrape, wait_for_scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


def fresh_connection_post(url: str) -> httpx.Response:
    # No keep-alive: each request is accepted anew, by whichever worker gets it.
    with httpx.Client(timeout=30.0, limits=NO_KEEPALIVE) as client:
        return client.post(url + CHAT, json=BODY)


def test_counters_add_up_across_two_workers(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream, tmp_path: Path
) -> None:
    proxy = proxy_server(
        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}, workers=2, upstream_metrics_interval=0
    )
    # Which worker accepts a connection is the kernel's choice and can favour one for
    # a while: send batches until both have served some (each keeps its own file of
    # counts), bounded so a broken second worker still fails the test.
    sent = 0
    served: dict[int, float] = {}
    with httpx.Client(base_url=proxy.url, timeout=30.0, limits=NO_KEEPALIVE) as client:
        while sent < 400 and (len(served) < 2 or sent < 40):
            for _ in range(20):
                assert client.post(CHAT, json=BODY).status_code == 200
            sent += 20
            served = _chat_requests_by_pid(tmp_path)
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    assert len(sim_upstream.chat_requests()) == sent
    # The access accounting of the last answer is written just after it goes out, so a
    # read right after the batch can be one short: wait (bounded) for the files to settle.
    deadline = time.monotonic() + 5.0
    while sum(served.values()) != sent and time.monotonic() < deadline:
        time.sleep(0.05)
        served = _chat_requests_by_pid(tmp_path)
    assert sum(served.values()) == sent, served
    # Several scrapes, each on a new connection: whichever worker answers, same numbers.
    for _ in range(6):
        m = scrape(proxy.url)
        assert m.value("trimproxy_requests_total", route=CHAT, code="200") == sent
        assert m.value("trimproxy_request_duration_seconds_count", route=CHAT) == sent
        assert m.value("trimproxy_prompt_tokens_count", stage="received") == sent
        assert m.value("trimproxy_prompt_tokens_count", stage="forwarded") == sent
        assert m.value("trimproxy_requests_in_flight") == 0  # the scrape is not counted
        assert not any(name.endswith("_created") for name in m.names())


def _worker_pids(proxy: ProxyProcess) -> list[int]:
    children = Path(f"/proc/{proxy.process.pid}/task/{proxy.process.pid}/children")
    return [int(p) for p in children.read_text().split()]


def _read(path: Path) -> list[tuple[str, float, float, int]]:
    # prometheus-client ships this reader without annotations.
    values: list[tuple[str, float, float, int]] = MmapedDict.read_all_values_from_file(  # type: ignore[no-untyped-call]
        str(path)
    )
    return values


def _chat_requests_by_pid(directory: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        for key, value, _ts, _pos in _read(path):
            _family, sample, labels, _help = json.loads(key)
            if sample == "trimproxy_requests_total" and labels["route"] == CHAT:
                pid = int(path.stem.rsplit("_", 1)[1])
                out[pid] = out.get(pid, 0.0) + value
    return out


def _in_flight_by_pid(directory: Path) -> dict[int, float]:
    out = {}
    for path in directory.glob("gauge_livesum_*.db"):
        for key, value, _ts, _pos in _read(path):
            if '"trimproxy_requests_in_flight"' in key:
                out[int(path.stem.rsplit("_", 1)[1])] = value
    return out


def test_a_killed_worker_leaves_no_request_in_flight_and_keeps_its_counts(
    proxy_server: Callable[..., ProxyProcess], sim_upstream: SimUpstream, tmp_path: Path
) -> None:
    directory = tmp_path / "multiproc"
    directory.mkdir()
    (directory / "counter_99999999.db").write_bytes(b"stale")  # wiped at start-up
    proxy = proxy_server(
        {"PROMETHEUS_MULTIPROC_DIR": str(directory)}, workers=2, upstream_metrics_interval=0.2
    )
    assert not (directory / "counter_99999999.db").exists()
    for _ in range(10):
        assert fresh_connection_post(proxy.url).status_code == 200
    workers = _worker_pids(proxy)  # the two workers (and multiprocessing's helper)
    assert len(_in_flight_by_pid(directory)) == 2

    # One request held in the upstream: its worker counts it in flight.
    sim_upstream.configure(delay_seconds=30)
    hung = threading.Thread(target=lambda: _swallow(fresh_connection_post, proxy.url))
    hung.start()
    deadline = time.monotonic() + 10
    while (busy := [p for p, v in _in_flight_by_pid(directory).items() if v == 1]) == []:
        assert time.monotonic() < deadline, "the held request never showed in flight"
        time.sleep(0.02)
    assert busy[0] in workers
    os.kill(busy[0], signal.SIGKILL)  # no chance to clean up after itself
    hung.join(timeout=30)
    sim_upstream.configure(delay_seconds=0)

    m = scrape(proxy.url)
    assert m.value("trimproxy_requests_in_flight") == 0  # not the dead one's, nor the scrape
    # What the dead worker counted still happened.
    assert m.value("trimproxy_requests_total", route=CHAT, code="200") == 10
    # The upstream scrape goes on, whichever worker holds the lock now.
    sim_upstream.configure(kv_usage_override=0.625)
    wait_for_scrape(
        proxy.url, lambda s: s.value("trimproxy_upstream_kv_cache_usage_ratio") == 0.625
    )


def _swallow(fn: Callable[[str], object], arg: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # its worker was killed under it
        fn(arg)
