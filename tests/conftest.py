"""Shared fixtures: the simulated upstream and the proxy, each as a real process.

* ``free_port()``: a TCP port on 127.0.0.1 that was free a moment ago.
* ``sim_upstream``: the session's vLLM-dialect sim (``proxy.sim``), reset before each
  test (start config, nothing recorded, counters zero). A ``SimUpstream``: ``url``,
  ``requests(path=None)``, ``chat_requests()``, ``clear()``, ``configure(**knobs)``,
  ``reset()``, ``state()``, ``wait_for_state(pred)``, ``metrics()``, ``logs()``.
* ``sim_upstream_factory(dialect="vllm", **config)``: fresh sims with any
  ``SimConfig`` fields; all stopped after the test.
* ``proxy_server(env=None, *, upstream=None, workers=None, **settings)``: starts
  ``python -m proxy.cli serve`` on a free port against ``upstream`` (a
  ``SimUpstream`` or a URL; the session sim when omitted) and waits for
  ``/healthz``. ``settings`` become ``TRIMPROXY_<NAME>`` (``max_prompt_tokens=900``),
  ``env`` is added as is. A ``ProxyProcess``: ``url``, ``port``, ``process``,
  ``logs()``, ``stop()``. All stopped after the test.

Processes run from a scratch directory (a developer's ``.env`` is not read), with
inherited ``TRIMPROXY_*`` variables removed, and log to files that ``logs()`` reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Same text as proxy.sim.cli.READY_PREFIX; not imported so that collecting the
# tests never depends on the package importing cleanly.
SIM_READY_PREFIX = "trimproxy-sim listening on "
SIM_START_TIMEOUT = 15.0
PROXY_START_TIMEOUT = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class _Process:
    """A child process logging to a file, stopped for good by ``stop()``."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], workdir: Path, name: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("wb") as log:  # the child keeps its own descriptor
            # Own session: stop() reaches the process group (uvicorn's workers too).
            self.process = subprocess.Popen(
                list(args),
                cwd=workdir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def logs(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        pid = self.process.pid
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.process.wait(grace)
        else:
            # The leader is gone; stray workers of its group must not outlive the test.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class SimUpstream:
    """A running ``proxy.sim`` process and its ``/_sim/*`` controls."""

    def __init__(self, proc: _Process, url: str, dialect: str) -> None:
        self._proc = proc
        self.url = url
        self.dialect = dialect
        self.process = proc.process
        self._http = httpx.Client(base_url=url, timeout=10.0)

    def __repr__(self) -> str:
        return f"SimUpstream({self.dialect}, {self.url})"

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise AssertionError(
                f"sim {response.request.url}: {response.status_code} {response.text}"
            )
        return response.json()

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """Recorded requests, oldest first; each has method, path, headers, body
        (text), json, status, stream, prompt_tokens, disconnected, times."""
        params = {"path": path} if path else None
        result: list[dict[str, Any]] = self._check(self._http.get("/_sim/requests", params=params))
        return result

    def chat_requests(self) -> list[dict[str, Any]]:
        return self.requests("/v1/chat/completions")

    def clear(self) -> None:
        self._check(self._http.delete("/_sim/requests"))

    def configure(self, **knobs: Any) -> dict[str, Any]:
        """Run-time knobs: fail_next={status, body, headers, times, path, close,
        delay_seconds}, delay_seconds, tokens_per_second, completion_tokens,
        max_model_len, model, kv_usage_override, legacy_metrics, error_style,
        strict_model. Returns ``state()``."""
        result: dict[str, Any] = self._check(self._http.post("/_sim/config", json=knobs))
        return result

    def reset(self) -> dict[str, Any]:
        result: dict[str, Any] = self._check(self._http.post("/_sim/reset"))
        return result

    def state(self) -> dict[str, Any]:
        """running, waiting, disconnects, completed, requests_total, kv_usage, config…"""
        result: dict[str, Any] = self._check(self._http.get("/_sim/state"))
        return result

    def wait_for_state(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 5.0
    ) -> dict[str, Any]:
        """Poll ``state()`` until ``predicate`` holds; fail with the last state if not."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"sim state never matched within {timeout}s: {state}")
            time.sleep(0.02)

    def metrics(self) -> str:
        return self._http.get("/metrics").text

    def logs(self) -> str:
        return self._proc.logs()

    def stop(self) -> None:
        self._http.close()
        self._proc.stop()


def start_sim(workdir: Path, dialect: str = "vllm", **config: Any) -> SimUpstream:
    import json

    config = {"dialect": dialect, **config}
    args = [sys.executable, "-m", "proxy.sim", "--host", "127.0.0.1", "--port", "0",
            "--config-json", json.dumps(config)]  # fmt: skip
    proc = _Process(args, _child_env(), workdir, f"sim-{dialect}-{time.monotonic_ns()}")
    deadline = time.monotonic() + SIM_START_TIMEOUT
    while True:
        for line in proc.logs().splitlines():
            if line.startswith(SIM_READY_PREFIX):
                return SimUpstream(proc, line[len(SIM_READY_PREFIX) :].strip(), dialect)
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            pytest.fail(f"the sim did not start (exit {proc.process.returncode}):\n{proc.logs()}")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def _sim_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimUpstream]:
    sim = start_sim(tmp_path_factory.mktemp("sim"))
    yield sim
    sim.stop()


@pytest.fixture
def sim_upstream(_sim_session: SimUpstream) -> SimUpstream:
    """The shared vLLM-dialect sim, as it started, with nothing recorded."""
    sim = _sim_session
    if not sim._proc.alive():
        pytest.fail(f"the session sim died:\n{sim.logs()}")
    # A previous test's slow request may still be running; let it end first so its
    # disconnect or tokens do not land in this test's counters.
    try:
        sim.wait_for_state(lambda s: s["running"] == 0 and s["waiting"] == 0, timeout=5.0)
    finally:
        sim.reset()
    return sim


@pytest.fixture
def sim_upstream_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., SimUpstream]]:
    """``factory(dialect="vllm", **SimConfig fields) -> SimUpstream``, stopped at the end."""
    started: list[SimUpstream] = []

    def factory(dialect: str = "vllm", **config: Any) -> SimUpstream:
        sim = start_sim(tmp_path_factory.mktemp("sim"), dialect, **config)
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


class ProxyProcess:
    """A running ``trimproxy serve``."""

    def __init__(self, proc: _Process, port: int, env: dict[str, str]) -> None:
        self._proc = proc
        self.process = proc.process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = env

    def __repr__(self) -> str:
        return f"ProxyProcess({self.url}, pid={self.process.pid})"

    def logs(self) -> str:
        return self._proc.logs()

    def stop(self) -> None:
        self._proc.stop()


def _setting_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _wait_healthy(proc: _Process, url: str, timeout: float) -> str | None:
    """None when ``/healthz`` answers 200, else why not."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if not proc.alive():
                return f"exited with {proc.process.returncode}"
            try:
                if client.get(f"{url}/healthz").status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    return f"no 200 from /healthz within {timeout:.0f}s"


@pytest.fixture
def proxy_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ProxyProcess]]:
    started: list[ProxyProcess] = []

    def start(
        env: Mapping[str, str] | None = None,
        *,
        upstream: SimUpstream | str | None = None,
        workers: int | None = None,
        timeout: float = PROXY_START_TIMEOUT,
        **settings: Any,
    ) -> ProxyProcess:
        if upstream is None:
            upstream = request.getfixturevalue("sim_upstream")
        upstream_url = upstream if isinstance(upstream, str) else upstream.url
        child = {"TRIMPROXY_UPSTREAM_URL": upstream_url}
        child.update({f"TRIMPROXY_{k.upper()}": _setting_value(v) for k, v in settings.items()})
        child.update(env or {})
        full_env = _child_env(child)
        workdir = tmp_path_factory.mktemp("proxy")
        for _attempt in range(3):
            port = free_port()
            args = [sys.executable, "-m", "proxy.cli", "serve",
                    "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
            if workers is not None:
                args += ["--workers", str(workers)]
            proc = _Process(args, full_env, workdir, f"proxy-{port}")
            why = _wait_healthy(proc, f"http://127.0.0.1:{port}", timeout)
            if why is None:
                server = ProxyProcess(proc, port, child)
                started.append(server)
                return server
            proc.stop()
            if "address already in use" not in proc.logs().lower():
                break  # another process took the port between free_port() and bind: retry
        pytest.fail(f"trimproxy serve did not become healthy ({why}):\n{proc.logs()}")

    yield start
    for server in started:
        server.stop()
