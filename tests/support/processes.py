"""Child processes for the tests where the process boundary is the point (workers,
signals, disconnects, the end-to-end stacks): one set of helpers for all of them.

* ``free_port()``: a TCP port on 127.0.0.1 that was free a moment ago.
* ``child_env(extra)``: the environment of a child: inherited ``TRIMPROXY_*`` removed,
  the repository on ``PYTHONPATH``, unbuffered output, no model hub.
* ``start_process(name, argv, log=, env=, cwd=, nice=)``: a child in its own session (so its
  whole group can be stopped), output to a log file; ``stop_process_group(proc)``.
* ``wait_for_http(url, timeout=, procs=, method=, body=)``: poll until 200, failing
  fast with the log tail when one of ``procs`` exits.
* ``LoggedProcess``: a child with its log, ``logs()``, ``alive()``, ``stop()``.
* ``ProxyProcess``: ``python -m proxy.cli serve`` on a free port, started the way
  users start it; a context manager.

Every child started here is stopped at interpreter exit at the latest.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

REPO_ROOT = Path(__file__).resolve().parents[2]
PROXY_START_TIMEOUT = 60.0

__all__ = [
    "PROXY_START_TIMEOUT",
    "REPO_ROOT",
    "LoggedProcess",
    "ProxyProcess",
    "StackError",
    "child_env",
    "free_port",
    "http_json",
    "setting_env",
    "start_process",
    "stop_process_group",
    "wait_for_http",
    "yield_cpu",
]


class StackError(RuntimeError):
    """A child process did not come up (or died); the message carries its log tail."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the OS picks; the race is acceptable:
    ``ProxyProcess`` retries when another process took it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: a developer's exported ``TRIMPROXY_*`` settings
    must not change what a test runs against."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.update(extra or {})
    return env


def setting_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """``{"max_prompt_tokens": 900}`` as ``{"TRIMPROXY_MAX_PROMPT_TOKENS": "900"}``;
    names may carry the prefix already."""
    env: dict[str, str] = {}
    for key, value in settings.items():
        name = key.upper()
        name = name if name.startswith("TRIMPROXY_") else f"TRIMPROXY_{name}"
        env[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return env


_LIVE: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    # A safety net for an interpreter that exits without running the fixtures' and
    # context managers' exits (a second Ctrl-C during teardown).
    for proc in list(_LIVE):
        stop_process_group(proc, grace=2.0)


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str],
    cwd: Path,
    nice: int = 0,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (so its group can be killed), output to ``log``.

    ``name`` is for the caller's messages; the log file is the child's own descriptor.
    ``nice`` > 0 lowers the whole session's CPU priority: see ``yield_cpu``.
    """
    del name
    if nice > 0:
        argv = ["nice", "-n", str(nice), *argv]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    _LIVE.add(proc)
    if nice > 0:
        yield_cpu(proc.pid, nice)
    return proc


def yield_cpu(pid: int, nice: int) -> None:
    """Lower the CPU weight of ``pid``'s session (a session leader: ``start_process``).

    A model engine on this machine's two cores (vLLM's CPU worker, FastChat's torch
    worker) keeps both busy; the kernel then left the proxy under test and the test
    itself runnable but unscheduled for up to 5 s at a time (their run-queue wait in
    ``/proc/<pid>/schedstat``), so a client's disconnect reached the engine seconds
    late. With autogroup scheduling on, a task's nice value counts only inside its
    session's group, so the group's own nice is set too. Best effort: no such file
    where the kernel has no autogroups, and ``nice -n`` covers that case.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the process's group (it has its own session), then SIGKILL.

    The group covers uvicorn's workers too; when the leader is already gone, strays
    of its group are killed so that they do not outlive the test.
    """
    _LIVE.discard(proc)
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    """One JSON request with the standard library (the caller's venv may have no httpx).

    Returns (status, decoded body); HTTP errors are returned, not raised.
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw.decode(errors="replace")


def tail(log: Path, size: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-size:]
    except OSError:
        return "<no log>"


def wait_for_http(
    url: str,
    *,
    timeout: float,
    procs: Sequence[tuple[str, subprocess.Popen[bytes], Path]] = (),
    accept: Callable[[Any], bool] | None = None,
    method: str = "GET",
    body: Any = None,
) -> Any:
    """Poll ``method url`` (JSON ``body``) until it answers 200 (and ``accept(body)`` holds).

    Fails fast with the log tail when one of ``procs`` exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        for name, proc, log in procs:
            if proc.poll() is not None:
                raise StackError(
                    f"{name} exited with {proc.returncode} while waiting for {url}:\n" + tail(log)
                )
        try:
            status, answer = http_json(method, url, body, timeout=2.0)
        except (OSError, ValueError) as error:
            last = error
        else:
            last = (status, answer)
            if status == 200 and (accept is None or accept(answer)):
                return answer
        time.sleep(0.05)
    logs = "".join(f"\n--- {name} ({log}) ---\n{tail(log)}" for name, _, log in procs)
    raise StackError(f"{url} not ready after {timeout:.0f}s (last: {last!r}){logs}")


class Stack:
    """A set of server processes as a context manager: ``start`` on entry (stopped
    again when the start fails half-way), ``stop`` on exit, also when a test fails."""

    def start(self) -> object:
        """Start everything; what it returns is the subclass's (``ProxyProcess``
        returns itself, for ``proxy = ProxyProcess(...).start()``)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoggedProcess:
    """A child process logging to ``<workdir>/<name>.log``, stopped for good by ``stop()``."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], workdir: Path, name: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.process = start_process(name, args, log=self.log_path, env=env, cwd=workdir)

    def logs(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        stop_process_group(self.process, grace)


@dataclass
class ProxyProcess(Stack):
    """One ``trimproxy serve`` on 127.0.0.1; ``settings`` are ``TRIMPROXY_*`` values,
    named with or without the prefix: ``{"max_prompt_tokens": 600}``.

    ``env`` adds raw variables; ``workers`` becomes ``--workers``. It runs in an empty
    directory (no stray ``.env`` is read) and logs to a file that ``logs()`` reads. It
    is up once ``ready_path`` answers 200; a subclass adds to ``serve_args``.
    ``command``: what the interpreter runs, ``serve`` and its flags after it (a bench
    script that serves the proxy its own way: ``bench/starlette_app.py``).
    """

    settings: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    workers: int | None = None
    startup_timeout: float = PROXY_START_TIMEOUT
    workdir: Path | None = None
    port: int = 0
    ready_path: str = "/healthz"
    command: tuple[str, ...] = ("-m", "proxy.cli")
    child: LoggedProcess | None = field(default=None, init=False)
    #: The log as it was when the process stopped (a temporary folder is removed then).
    final_log: str = field(default="", init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    base_url = url

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.child is not None, "the proxy is not running"
        return self.child.process

    def child_env(self) -> dict[str, str]:
        return child_env({**setting_env(self.settings), **self.env})

    def serve_args(self) -> list[str]:
        """``serve``'s arguments besides the address."""
        return [] if self.workers is None else ["--workers", str(self.workers)]

    def start(self) -> ProxyProcess:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="trimproxy-proc-")
            self.workdir = Path(self._tmp.name)
        fixed = bool(self.port)
        why = ""
        for _attempt in range(1 if fixed else 3):
            self.port = self.port if fixed else free_port()
            args = [sys.executable, *self.command, "serve", "--host", "127.0.0.1",
                    "--port", str(self.port), *self.serve_args()]  # fmt: skip
            child = LoggedProcess(args, self.child_env(), self.workdir, f"proxy-{self.port}")
            try:
                wait_for_http(
                    f"{self.url}{self.ready_path}",
                    timeout=self.startup_timeout,
                    procs=[("trimproxy", child.process, child.log_path)],
                )
            except StackError as exc:
                child.stop()
                why = str(exc)
                if "address already in use" not in child.logs().lower():
                    break
                continue  # another process took the port between free_port() and bind
            self.child = child
            return self
        raise StackError(f"trimproxy serve did not answer {self.ready_path}: {why}")

    def logs(self) -> str:
        if self.child is None:
            return self.final_log
        try:
            return self.child.logs()
        except OSError:
            return ""

    log_text = logs

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.final_log = self.logs()
            self.child = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __repr__(self) -> str:
        pid = self.child.process.pid if self.child else None
        return f"ProxyProcess({self.url}, pid={pid})"
