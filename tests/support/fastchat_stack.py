"""A real FastChat 0.2.36 stack (controller, model worker, OpenAI API server) on loopback.

FastChat needs pydantic 1 and transformers 4.x while trimproxy needs pydantic 2, so it
lives in its own venv, built by ``ensure_fastchat_env()`` from exact pins (torch first
and alone: a plain ``torch`` requirement would pull a multi-GB CUDA build; the CPU
wheel of 2.13.0 lies on this machine's disk). ``FastChatStack`` serves the tiny model
from ``tiny_model.build_model`` on CPU and is a context manager that always stops its
processes (by process group), also when a test fails or on Ctrl-C.

Nothing here reaches outside loopback: HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE are set for
every FastChat process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import (
    Stack,
    StackError,
    free_port,
    http_json,
    start_process,
    stop_process_group,
    tail,
    wait_for_http,
)
from tests.support.tiny_model import MODEL_NAME, ModelShape, build_model, cache_root

__all__ = [
    "FASTCHAT_PINS",
    "FastChatStack",
    "StackError",
    "ensure_fastchat_env",
]

TORCH_PIN = "torch==2.13.0"
#: The FastChat venv, locked in full. fschat 0.2.36 breaks on pydantic 2 (streaming)
#: and on transformers 5 (rope_scaling); the rest is the set resolved with them, pinned
#: so that CI builds the very venv the timings were measured on.
FASTCHAT_PINS: tuple[str, ...] = (
    "fschat==0.2.36",
    "transformers==4.57.6",
    "tokenizers==0.22.2",
    "huggingface-hub==0.36.2",
    "pydantic==1.10.27",
    "fastapi==0.125.0",
    "starlette==0.50.0",
    "uvicorn==0.54.0",
    "accelerate==1.15.0",
    "sentencepiece==0.2.3",
    "protobuf==7.36.2",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "httpx==0.28.1",
    "httpcore==1.0.9",
    "requests==2.34.2",
    "shortuuid==1.0.13",
    "aiohttp==3.14.5",
    "psutil==7.2.2",
    "tiktoken==0.14.0",
    "prompt_toolkit==3.0.53",
    "rich==15.0.0",
    "markdown2==2.5.5",
    "nh3==0.3.8",
)
_MARKER = "trimproxy-pins.txt"


# --------------------------------------------------------------------------- venv


def _pins_text() -> str:
    return "\n".join((TORCH_PIN, *FASTCHAT_PINS)) + "\n"


def _venv_dir() -> Path:
    env = os.environ.get("TRIMPROXY_FASTCHAT_VENV")
    return Path(env) if env else cache_root() / "fastchat-venv"


def _base_python() -> str:
    # The CPU torch wheel on disk is for CPython 3.11 only.
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise StackError("the FastChat venv needs python3.11 (torch 2.13.0 CPU wheel)")
    return found


def _pip(python: Path, args: Sequence[str], log: Path) -> None:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
    with log.open("a") as out:
        out.write(f"\n$ pip {' '.join(args)}\n")
        out.flush()
        result = subprocess.run(
            [str(python), "-m", "pip", *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if result.returncode != 0:
        tail = log.read_text()[-3000:]
        raise StackError(f"pip {' '.join(args)} failed (log {log}):\n{tail}")


def ensure_fastchat_env() -> Path:
    """Create (or reuse) the FastChat venv and return its directory.

    Idempotent: a marker file holds the pin list it was built from; a venv with another
    marker, or none (a half-built one), is rebuilt from scratch. A file lock keeps two
    test processes from building at once.
    """
    venv = _venv_dir()
    marker = venv / _MARKER
    pins = _pins_text()
    if marker.is_file() and marker.read_text() == pins:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / f"{venv.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == pins:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        log = venv.parent / f"{venv.name}.build.log"
        log.write_text(f"building {venv}\n")
        requirements = venv / "requirements.txt"
        requirements.write_text("\n".join(FASTCHAT_PINS) + "\n")
        constraints = venv / "constraints.txt"
        constraints.write_text(TORCH_PIN + "\n")
        # torch first and alone, so that nothing resolves a CUDA build; then the rest
        # constrained to that torch.
        _pip(python, ["install", "-q", TORCH_PIN], log)
        _pip(python, ["install", "-q", "-r", str(requirements), "-c", str(constraints)], log)
        marker.write_text(pins)
    return venv


def fastchat_python() -> Path:
    return ensure_fastchat_env() / "bin" / "python"


# --------------------------------------------------------------------------- the stack


@dataclass
class StartupTimings:
    """Seconds spent in each start-up phase (for the report and the benchmark)."""

    venv: float = 0.0
    model: float = 0.0
    ready: float = 0.0
    first_completion: float = 0.0


@dataclass
class FastChatStack(Stack):
    """Controller + model worker + OpenAI API server serving the tiny model on CPU.

    Use as ``with FastChatStack() as stack: ...``; ``stack.base_url`` is the API
    server's root (append ``/v1`` for the OpenAI SDK).
    """

    #: The stack's folder in the temp dir is ``<folder>-<pid>``: a second stack in the
    #: same test process needs a name of its own.
    folder: str = "trimproxy-fastchat"
    model_name: str = MODEL_NAME
    startup_timeout: float = 180.0
    #: FastChat's per-worker concurrency limit (its semaphore; default 5 upstream).
    worker_concurrency: int = 5
    #: The tiny model's architecture (None: ``tiny_model.FASTCHAT_SHAPE``).
    shape: ModelShape | None = None
    #: > 0 lowers the worker's CPU priority (``processes.yield_cpu``): the tests'
    #: stack, so that the proxy and the test sharing its cores are scheduled.
    nice: int = 0
    timings: StartupTimings = field(default_factory=StartupTimings)
    controller_port: int = 0
    worker_port: int = 0
    api_port: int = 0
    model_dir: Path = field(init=False)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    logs: dict[str, Path] = field(default_factory=dict, init=False)
    workdir: Path | None = field(default=None, init=False)

    # --- addresses

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def model(self) -> str:
        return self.model_name

    @property
    def controller_url(self) -> str:
        return f"http://127.0.0.1:{self.controller_port}"

    @property
    def worker_url(self) -> str:
        return f"http://127.0.0.1:{self.worker_port}"

    # --- lifecycle

    def start(self) -> None:
        began = time.monotonic()
        python = fastchat_python()
        self.timings.venv = time.monotonic() - began

        # A short path of our own: FastChat picks a model adapter by substrings of the
        # model path ("t5", "mpt", "qwen", ...), so the path the worker sees must contain
        # none; a random temp name or a CI checkout path might. The temp dir outlives a
        # checkout: an earlier run's folder with this pid goes first.
        self.workdir = Path(tempfile.gettempdir()) / f"{self.folder}-{os.getpid()}"
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)

        began = time.monotonic()
        self.model_dir = build_model(
            self.workdir / self.model_name, python=python, shape=self.shape
        )
        self.timings.model = time.monotonic() - began

        began = time.monotonic()
        self.controller_port = self.controller_port or free_port()
        self.worker_port = self.worker_port or free_port()
        self.api_port = self.api_port or free_port()
        env = self._env()
        workdir = self.workdir
        self.logs = {name: self.workdir / f"{name}.log" for name in ("controller", "worker", "api")}
        self.procs["controller"] = start_process(
            "controller",
            [
                str(python),
                "-m",
                "fastchat.serve.controller",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.controller_port),
            ],
            log=self.logs["controller"],
            env=env,
            cwd=workdir,
        )
        # The worker registers with the controller once, at start-up; if the
        # controller is not listening yet it only retries on its heartbeat. So the
        # controller must answer first.
        wait_for_http(
            f"{self.controller_url}/test_connection",
            timeout=self.startup_timeout,
            procs=[("controller", self.procs["controller"], self.logs["controller"])],
        )
        self.procs["worker"] = start_process(
            "worker",
            [
                str(python),
                "-m",
                "fastchat.serve.model_worker",
                "--model-path",
                str(self.model_dir),
                "--model-names",
                self.model_name,
                "--conv-template",
                "qwen-7b-chat",
                "--device",
                "cpu",
                "--limit-worker-concurrency",
                str(self.worker_concurrency),
                "--controller-address",
                self.controller_url,
                "--worker-address",
                self.worker_url,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.worker_port),
            ],
            log=self.logs["worker"],
            env=env,
            cwd=workdir,
            nice=self.nice,
        )
        self.procs["api"] = start_process(
            "api",
            [
                str(python),
                "-m",
                "fastchat.serve.openai_api_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.api_port),
                "--controller-address",
                self.controller_url,
            ],
            log=self.logs["api"],
            env=env,
            cwd=workdir,
        )
        watched = [(name, proc, self.logs[name]) for name, proc in self.procs.items()]
        # Ready = the worker answers on its own port AND the API server lists the model;
        # then one real completion proves the whole path generates. The listing alone
        # is not enough: the worker registers with the controller (in ModelWorker's
        # __init__) before uvicorn binds its port, and when /v1/models' refresh of the
        # workers runs just before that registration, the model is listed while its
        # worker still refuses connections, and the first request fails with a 500.
        wait_for_http(
            f"{self.worker_url}/worker_get_status",
            method="POST",
            body={},
            timeout=self.startup_timeout,
            procs=watched,
            accept=lambda body: self.model_name in body.get("model_names", []),
        )
        wait_for_http(
            f"{self.api_base}/models",
            timeout=self.startup_timeout,
            procs=watched,
            accept=lambda body: any(m.get("id") == self.model_name for m in body["data"]),
        )
        self.timings.ready = time.monotonic() - began
        began = time.monotonic()
        status, body = http_json(
            "POST",
            f"{self.api_base}/chat/completions",
            {
                "model": self.model_name,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hello"}],
            },
            timeout=60.0,
        )
        if status != 200 or "choices" not in body:
            raise StackError(f"first completion failed: {status} {body}\n{self.log_tails()}")
        self.timings.first_completion = time.monotonic() - began

    def _env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # The caller's venv must not leak into FastChat's interpreter.
            if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        }
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONUNBUFFERED="1",
            # FastChat writes its own log files into LOGDIR (default: the cwd).
            LOGDIR=str(self.workdir),
            # Two cores: one torch thread leaves the other to the proxy and the client.
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            # Backstop for a lost registration (FastChat's default: every 45 s).
            FASTCHAT_WORKER_HEART_BEAT_INTERVAL="5",
        )
        return env

    def stop(self) -> None:
        # API server first, so no new request reaches a dying worker.
        for name in ("api", "worker", "controller"):
            proc = self.procs.get(name)
            if proc is not None:
                stop_process_group(proc)
        if self.workdir is not None and not os.environ.get("TRIMPROXY_KEEP_FASTCHAT_LOGS"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- introspection for tests

    def worker_status(self) -> dict[str, Any]:
        """The worker's ``/worker_get_status``: model_names, speed, queue_length."""
        status, body = http_json("POST", f"{self.worker_url}/worker_get_status", {})
        if status != 200:
            raise StackError(f"worker_get_status: {status} {body}")
        return dict(body)

    def worker_cpu_seconds(self) -> float:
        """User+system CPU seconds the worker process has used (from /proc)."""
        pid = self.procs["worker"].pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        # fields[11], fields[12] are utime, stime (stat fields 14 and 15).
        return (int(fields[11]) + int(fields[12])) / ticks

    def log_tails(self, size: int = 3000) -> str:
        return "".join(f"\n--- {name} ---\n{tail(path, size)}" for name, path in self.logs.items())

    def iter_logs(self) -> Iterator[tuple[str, Path]]:
        yield from self.logs.items()


def pins_digest() -> str:
    return hashlib.sha256(_pins_text().encode()).hexdigest()[:12]


if __name__ == "__main__":  # pragma: no cover - manual use: start a stack and wait
    with FastChatStack() as stack:
        print(
            json.dumps(
                {
                    "base_url": stack.base_url,
                    "model": stack.model,
                    "model_dir": str(stack.model_dir),
                    "timings": stack.timings.__dict__,
                }
            ),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
