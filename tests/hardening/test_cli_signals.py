"""The CLI: ``kill -TERM`` of ``serve --demo`` stops its sim too, and
a tokenizer that cannot be loaded is one clear line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.demo import DemoProcess
from tests.support.processes import free_port


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env.update(extra)
    return env


def test_sigterm_of_serve_demo_stops_the_embedded_sim() -> None:
    with DemoProcess() as demo:
        (sim_url,) = demo.upstreams()
        assert httpx.get(f"{sim_url}/health", timeout=5).status_code == 200
        returncode = demo.stop_with(signal.SIGTERM)
        assert returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        deadline = time.monotonic() + 10  # a hang guard, not a measurement
        while True:
            try:
                httpx.get(f"{sim_url}/health", timeout=1)
            except httpx.TransportError:
                break  # the sim is gone
            assert time.monotonic() < deadline, "the embedded sim outlived serve --demo"
            time.sleep(0.1)


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_unloadable_tokenizer_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "no" / "such" / "dir" if kind == "missing" else tmp_path
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--port", str(free_port())],
        env=clean_env(TRIMPROXY_TOKENIZER=f"hf:{target}", TRIMPROXY_UPSTREAM_METRICS_INTERVAL="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert "TRIMPROXY_TOKENIZER" in lines[0]
    assert "Traceback" not in out.stderr + out.stdout
