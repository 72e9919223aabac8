"""Engines found in DNS: a real dnsmasq names sim engines on 127.0.0.x, a real trimproxy
resolves ``dns+http://NAME:PORT`` and follows the name as engines join and leave."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.dnsmasq import Dnsmasq, dnsmasq_binary
from tests.support.processes import ProxyProcess, free_port
from tests.support.sim import SimProcess

pytestmark = pytest.mark.skipif(
    dnsmasq_binary() is None, reason="dnsmasq is not installed (apt-get install -y dnsmasq-base)"
)
NAME = "vllm-headless.test"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[SimProcess]]:
    port = free_port()
    sims = [SimProcess(tmp_path, port, host) for host in HOSTS]
    for sim in sims:
        sim.start()
    yield sims
    for sim in sims:
        sim.stop()


def chat(base: str, session: str) -> httpx.Response:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": session}],
            "max_tokens": 4}  # fmt: skip
    return httpx.post(f"{base}/v1/chat/completions", json=body,
                      headers={"x-session-id": session}, timeout=30)  # fmt: skip


def engines_up(proxy: ProxyProcess) -> tuple[int, int]:
    ready = httpx.get(f"{proxy.url}/readyz", timeout=10).json()
    return ready["engines"], ready["engines_up"]


def wait_for_engines(proxy: ProxyProcess, count: int) -> None:
    deadline = time.monotonic() + 30  # a hang guard: the refresh is 0.3 s
    while engines_up(proxy)[0] != count:
        assert time.monotonic() < deadline, f"never {count} engines: {engines_up(proxy)}"
        time.sleep(0.1)


def test_engines_join_and_leave_with_the_name(tmp_path: Path, engines: list[SimProcess]) -> None:
    port = engines[0].port
    with Dnsmasq(tmp_path, {NAME: HOSTS[:2]}) as dns:
        settings = {"upstream_url": f"dns+http://{NAME}:{port}", "dns_nameserver": dns.nameserver,
                    "upstream_refresh": 0.3, "tokenizer": "approx",
                    "upstream_metrics_interval": 0, "health_interval": 0.5}  # fmt: skip
        with ProxyProcess(settings) as proxy:
            assert engines_up(proxy) == (2, 2)  # resolved before it served
            sessions = [f"s{i}" for i in range(12)]
            for session in sessions:
                assert chat(proxy.url, session).status_code == 200
            assert sum(len(e.chat_requests()) for e in engines[:2]) == 12
            assert engines[2].chat_requests() == []

            dns.set_records(NAME, HOSTS)  # a pod joins
            wait_for_engines(proxy, 3)
            for session in sessions:
                assert chat(proxy.url, session).status_code == 200  # nothing lost
            joined = engines[2].chat_requests()
            assert joined, "the new engine took none of its sessions"

            dns.set_records(NAME, HOSTS[1:])  # the first leaves the name
            wait_for_engines(proxy, 2)
            before = len(engines[0].chat_requests())
            for session in sessions:
                assert chat(proxy.url, session).status_code == 200
            assert len(engines[0].chat_requests()) == before  # no longer sent anything
