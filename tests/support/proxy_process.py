"""trimproxy started the way users start it: ``python -m proxy.cli serve`` in its own process.

The real process is the point: the CLI, settings from the environment, uvicorn, the
lifespan and the upstream client all run as in production. Used by the FastChat e2e
tests and by ``bench/fastchat_latency.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tests.support.fastchat_stack import (
    _LIVE,
    free_port,
    start_process,
    stop_process_group,
    wait_for_http,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ProxyProcess:
    """One trimproxy server on 127.0.0.1; ``settings`` are ``TRIMPROXY_*`` values.

    Keys may be given with or without the prefix: ``{"MAX_PROMPT_TOKENS": 600}``.
    """

    settings: dict[str, str | int | float]
    startup_timeout: float = 60.0
    port: int = 0
    log: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    #: The log as it was when the process stopped (its folder is removed then).
    final_log: str = field(default="", init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def env(self) -> dict[str, str]:
        # Start from a clean TRIMPROXY_* slate: a developer's exported settings must
        # not change what a test runs against.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
        for key, value in self.settings.items():
            name = key.upper()
            name = name if name.startswith("TRIMPROXY_") else f"TRIMPROXY_{name}"
            env[name] = str(value)
        # The repo on the path whether or not the package is installed; the process
        # runs in an empty directory so that no stray .env file is read.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        return env

    def start(self) -> ProxyProcess:
        self._tmp = tempfile.TemporaryDirectory(prefix="trimproxy-proc-")
        workdir = Path(self._tmp.name)
        self.port = self.port or free_port()
        self.log = workdir / "proxy.log"
        self.proc = start_process(
            "proxy",
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            log=self.log,
            env=self.env(),
            cwd=workdir,
        )
        wait_for_http(
            f"{self.base_url}/healthz",
            timeout=self.startup_timeout,
            procs=[("trimproxy", self.proc, self.log)],
        )
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            _LIVE.discard(self.proc)
            self.proc = None
            self.final_log = self.log_text()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ProxyProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
