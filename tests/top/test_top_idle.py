"""``trimproxy top`` on an idle proxy shows no traffic: its own readings of
``/metrics`` are not client requests (no tmux needed: the output is a pipe, one block
of plain lines per reading)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ProxyProcess, child_env
from tests.support.sim import start_sim_thread


def test_an_idle_proxy_shows_no_requests_per_second() -> None:
    sim = start_sim_thread("vllm")
    proc = ProxyProcess(settings={"upstream_url": sim.url, "tokenizer": "approx",
                                  "upstream_metrics_interval": 0})  # fmt: skip
    proc.start()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "top", proc.url, "--interval", "0.2",
             "--count", "4"],
            env=child_env(), capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        log = proc.logs()  # for the message below
        scraped = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "top", proc.url, "--once"],
            env=child_env(), capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    finally:
        proc.stop()
        sim.stop()
    said = [line for line in out.splitlines() if line.startswith("requests ")]
    assert len(said) == 4, out
    # The first reading has no earlier one: totals; every later one a rate, and top
    # read /metrics before each of them.
    assert said[0].startswith("requests 0 (totals"), said
    for line in said[1:]:
        assert line.startswith("requests 0/s "), (line, log)
    assert any(line.startswith("errors/s   none") for line in out.splitlines())
    # Five scrapes later, the totals still count no request.
    assert next(line for line in scraped.splitlines() if line.startswith("requests ")).startswith(
        "requests 0 (totals"
    )
