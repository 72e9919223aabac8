"""The simulated upstream (``proxy.sim``) for the tests, and its ``/_sim/*`` controls.

Two ways to run it, one interface (``SimUpstream``):

* ``start_sim_thread(dialect, **config)``: the sim's aiohttp app served on a free
  127.0.0.1 port by an event loop in a thread of the test process. A real server
  (the proxy's aiohttp client talks TCP to it, in-process or from a child process),
  up in milliseconds.
* ``start_sim_process(workdir, dialect, **config)``: ``python -m proxy.sim`` as a
  child, for the tests that measure the sim as a process or need it to outlive the
  test process's event loops.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.support.processes import LoggedProcess, StackError, child_env

# Same text as proxy.sim.cli.READY_PREFIX; not imported so that starting a sim process
# never depends on the package importing cleanly in the test process.
SIM_READY_PREFIX = "trimproxy-sim listening on "
SIM_START_TIMEOUT = 15.0


class _Runner(Protocol):
    def logs(self) -> str: ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


class SimUpstream:
    """A running sim and its ``/_sim/*`` controls."""

    def __init__(self, runner: _Runner, url: str, dialect: str) -> None:
        self._runner = runner
        self.url = url
        self.dialect = dialect
        self._http = httpx.Client(base_url=url, timeout=10.0)

    def __repr__(self) -> str:
        return f"SimUpstream({self.dialect}, {self.url})"

    @property
    def process(self) -> Any:
        """The child process (``start_sim_process`` only)."""
        if not isinstance(self._runner, LoggedProcess):
            raise AttributeError("this sim runs in a thread of the test process")
        return self._runner.process

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise AssertionError(
                f"sim {response.request.url}: {response.status_code} {response.text}"
            )
        return response.json()

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """Recorded requests, oldest first; each has method, path, headers, body
        (text), json, status, stream, prompt_tokens, disconnected, times, raw_path."""
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
        return self._runner.logs()

    def alive(self) -> bool:
        return self._runner.alive()

    def stop(self) -> None:
        self._http.close()
        self._runner.stop()


class SimThread:
    """``proxy.sim.server.serve`` on its own event loop in a daemon thread."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, name="trimproxy-sim", daemon=True)

    def start(self, timeout: float = SIM_START_TIMEOUT) -> str:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise StackError(f"the in-process sim did not listen within {timeout:.0f}s")
        if self._error is not None:
            raise StackError(f"the in-process sim did not start: {self._error!r}")
        return self.url

    def _on_ready(self, url: str) -> None:
        self.url = url
        self._ready.set()

    def _run(self) -> None:
        from proxy.sim.server import serve

        asyncio.set_event_loop(self._loop)
        task = self._loop.create_task(serve(self._config, "127.0.0.1", 0, ready=self._on_ready))
        self._task = task
        try:
            self._loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported to start(), which raises it
            self._error = exc
            self._ready.set()
        finally:
            # The runner's cleanup closes the open connections with transport.close(),
            # which finishes on a later turn of the loop; closing the loop first would
            # leave those sockets for the garbage collector (a ResourceWarning that
            # pytest pins on whatever test runs then).
            self._loop.run_until_complete(asyncio.sleep(0.05))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def logs(self) -> str:
        return ""  # the sim logs nothing per request; errors surface as exceptions

    def alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def stop(self) -> None:
        task = self._task
        if task is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(task.cancel)
        self._thread.join(10.0)
        # A sim stopped under a client (an outage, on purpose) leaves the server side of
        # that client's keep-alive connection to the garbage collector; collect it here,
        # where that is expected, rather than as a ResourceWarning that pytest pins on
        # whatever test happens to run when the collector comes by.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def start_sim_thread(dialect: str = "vllm", **config: Any) -> SimUpstream:
    from proxy.sim.config import SimConfig

    runner = SimThread(SimConfig(dialect=dialect, **config))  # type: ignore[arg-type]
    return SimUpstream(runner, runner.start(), dialect)


def start_sim_process(workdir: Path, dialect: str = "vllm", **config: Any) -> SimUpstream:
    config = {"dialect": dialect, **config}
    args = [sys.executable, "-m", "proxy.sim", "--host", "127.0.0.1", "--port", "0",
            "--config-json", json.dumps(config)]  # fmt: skip
    proc = LoggedProcess(args, child_env(), workdir, f"sim-{dialect}-{time.monotonic_ns()}")
    deadline = time.monotonic() + SIM_START_TIMEOUT
    while True:
        for line in proc.logs().splitlines():
            if line.startswith(SIM_READY_PREFIX):
                return SimUpstream(proc, line[len(SIM_READY_PREFIX) :].strip(), dialect)
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            raise StackError(
                f"the sim did not start (exit {proc.process.returncode}):\n{proc.logs()}"
            )
        time.sleep(0.02)


class SimProcess:
    """A sim in a child process on a fixed port, so it can be killed and restarted."""

    def __init__(self, workdir: Path, port: int, host: str = "127.0.0.1") -> None:
        self.workdir, self.port, self.host = workdir, port, host
        self.url = f"http://{host}:{port}"
        self.proc: LoggedProcess | None = None

    def start(self) -> None:
        config = json.dumps({"dialect": "vllm"})
        args = [sys.executable, "-m", "proxy.sim", "--host", self.host,
                "--port", str(self.port), "--config-json", config]  # fmt: skip
        self.proc = LoggedProcess(
            args, child_env(), self.workdir, f"sim-{self.host}-{self.port}-{time.time_ns()}"
        )
        deadline = time.monotonic() + 15
        while SIM_READY_PREFIX not in self.proc.logs():
            assert self.proc.alive() and time.monotonic() < deadline, self.proc.logs()
            time.sleep(0.02)

    def chat_requests(self) -> list[dict[str, Any]]:
        """The chat requests it recorded (``/_sim/requests``), oldest first."""
        response = httpx.get(
            f"{self.url}/_sim/requests", params={"path": "/v1/chat/completions"}, timeout=10
        )
        response.raise_for_status()
        records: list[dict[str, Any]] = response.json()
        return records

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.process.kill()  # SIGKILL
        self.proc.process.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@contextmanager
def sim_threads(count: int, dialect: str = "vllm") -> Iterator[list[SimUpstream]]:
    """``count`` in-thread sims (``start_sim_thread``), stopped when the block ends: the
    engines of a multi-engine test."""
    engines = [start_sim_thread(dialect) for _ in range(count)]
    try:
        yield engines
    finally:
        for sim in engines:
            sim.stop()
