"""``trimproxy top`` as an operator uses it: against a real proxy in front of the sim,
under load, in a real terminal (tmux), and ``--once`` next to ``/metrics``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream, start_sim_thread

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def proxy() -> Iterator[tuple[ProxyProcess, SimUpstream]]:
    sim = start_sim_thread("vllm", tokens_per_second=200.0, completion_tokens=8)
    settings = {"upstream_url": sim.url, "tokenizer": "approx", "max_prompt_tokens": 300,
                "upstream_metrics_interval": 0.5}  # fmt: skip
    proc = ProxyProcess(settings=settings)
    proc.start()
    try:
        yield proc, sim
    finally:
        proc.stop()
        sim.stop()


def converse(url: str, conversations: int, turns: int) -> None:
    def one(i: int) -> None:
        history = [{"role": "system", "content": "be brief"}]
        with httpx.Client(timeout=30) as client:
            for t in range(turns):
                history.append({"role": "user", "content": f"conversation {i} turn {t} " * 12})
                reply = client.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "sim-model", "messages": history, "max_tokens": 8},
                    headers={"X-Session-ID": f"c{i}"},
                )
                assert reply.status_code == 200, reply.text
                history.append(reply.json()["choices"][0]["message"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(conversations)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))  # fmt: skip


def test_once_prints_what_metrics_says(proxy: tuple[ProxyProcess, SimUpstream]) -> None:
    proc, sim = proxy
    converse(proc.url, conversations=3, turns=6)
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "top", proc.url, "--once"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    text = httpx.get(f"{proc.url}/metrics").text
    requests = metric(text, 'trimproxy_requests_total{code="200",route="/v1/chat/completions"}')
    trims = metric(text, "trimproxy_trim_events_total")
    assert trims > 0  # the budget of 300 cut these conversations
    # The chat requests, and not top's own scrapes of /metrics.
    said = next(line for line in out.splitlines() if line.startswith("requests "))
    assert int(said.split()[1]) == requests == 18
    assert f"trims {int(trims)}" in said
    assert "received: p50 <= " in out and "forwarded: p50 <= " in out
    engine = sim.url.removeprefix("http://")  # its row: the engine label, host:port
    rows = [line.split() for line in out.splitlines() if line.startswith(engine + " ")]
    assert rows and rows[0][1] == "yes", out  # in the rotation


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def test_the_live_screen_under_load(proxy: tuple[ProxyProcess, SimUpstream]) -> None:
    proc, sim = proxy
    engine = sim.url.removeprefix("http://")
    session = f"trimproxy-top-{proc.port}"
    command = f"{sys.executable} -m proxy.cli top {proc.url} --interval 0.5"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "30",
                    command], check=True)  # fmt: skip
    try:
        # The load goes on until the screen has shown it: top's first two readings can
        # come after a short burst has ended (a busy machine starts its process slowly).
        stop = threading.Event()

        def keep_loading() -> None:
            while not stop.is_set():
                converse(proc.url, 4, 10)

        load = threading.Thread(target=keep_loading)
        load.start()
        seen = ""
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while time.monotonic() < deadline:
            seen = _screen(session)
            rates = [line for line in seen.splitlines() if line.startswith("requests ")]
            # One screen with a request rate and the window's prompt sizes: a capture can
            # fall between two readings, or catch the screen while it is being redrawn.
            busy = rates and not rates[0].startswith("requests 0/s") and "/s" in rates[0]
            if busy and "received: p50 <= " in seen:
                break
            time.sleep(0.2)
        stop.set()
        load.join()
        assert "trimproxy top" in seen and "hit ratio" in seen and "kv use" in seen
        assert any(line.startswith(engine + " ") and " yes " in line for line in seen.splitlines())
        rates = [line for line in seen.splitlines() if line.startswith("requests ")]
        assert rates and "/s" in rates[0] and not rates[0].startswith("requests 0/s"), seen
        assert "received: p50 <= " in seen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
