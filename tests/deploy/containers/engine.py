"""The container engine and compose tool that scripts/container-test.sh picked, as the
tests drive them: the same commands for docker and podman, named in each failure."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Set by scripts/container-test.sh; without them the container tests are skipped.
ENV_ENGINE = "TRIMPROXY_CT_ENGINE"
ENV_COMPOSE = "TRIMPROXY_CT_COMPOSE"
ENV_IMAGE = "TRIMPROXY_CT_IMAGE"
ENV_PYTHON = "TRIMPROXY_CT_PYTHON_IMAGE"
ENV_REDIS = "TRIMPROXY_CT_REDIS_IMAGE"
ENV_PROMETHEUS = "TRIMPROXY_CT_PROMETHEUS_IMAGE"
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


class EngineError(AssertionError):
    """A command of the engine failed; the message holds the command and its output."""


def _completed(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def _run(argv: Sequence[str], timeout: float, check: bool = True) -> str:
    done = _completed(argv, timeout)
    if check and done.returncode != 0:
        raise EngineError(
            f"`{shlex.join(argv)}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stdout


@dataclass(frozen=True)
class Engine:
    """``docker`` or ``podman``: both take these commands the same way."""

    name: str

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return _run([self.name, *args], timeout, check)

    def inspect(self, target: str, kind: str = "container") -> dict[str, Any]:
        (found,) = json.loads(self(kind, "inspect", target))
        assert isinstance(found, dict)
        return found

    def host_port(self, container: str, port: int) -> int:
        """The loopback port the container's ``port`` is published on."""
        line = self("port", container, f"{port}/tcp").splitlines()[0]
        return int(line.rsplit(":", 1)[1])

    def healthy(self, container: str) -> bool:
        """Whether the image's HEALTHCHECK passes now. podman runs it on demand (its
        timers need systemd, which these machines lack); docker runs it on its own
        schedule and reports the status."""
        if self.name == "podman":
            return _completed(["podman", "healthcheck", "run", container], 30).returncode == 0
        health = self.inspect(container)["State"].get("Health") or {}
        return bool(health.get("Status") == "healthy")

    def wait_healthy(self, container: str, attempts: int = 120) -> None:
        """Until the HEALTHCHECK passes; fails with the container's log."""
        for _ in range(attempts):
            if self.healthy(container):
                return
            state = self.inspect(container)["State"]
            if state.get("Status") in ("exited", "dead"):
                break
            time.sleep(1)
        logs = self("logs", container, check=False)
        raise EngineError(f"{container} never became healthy:\n{logs[-4000:]}")

    def containers(self, project: str, service: str) -> list[str]:
        """The names of a compose service's containers, replicas in name order."""
        out = self(
            "ps",
            "-a",
            "--filter",
            f"label={PROJECT_LABEL}={project}",
            "--filter",
            f"label={SERVICE_LABEL}={service}",
            "--format",
            "{{.Names}}",
        )
        return sorted(out.split())


@dataclass(frozen=True)
class Compose:
    """``docker compose`` or podman-compose on compose.yaml plus the CI override."""

    command: tuple[str, ...]
    files: tuple[Path, ...]
    env_file: Path
    project: str

    def argv(self, *args: str) -> list[str]:
        argv = [*self.command, "-p", self.project, "--env-file", str(self.env_file)]
        for path in self.files:
            argv += ["-f", str(path)]
        return [*argv, *args]

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return _run(self.argv(*args), timeout, check)


def from_environment() -> tuple[Engine, tuple[str, ...], dict[str, str]] | None:
    """The engine, the compose command and the images, or None outside the script."""
    names = (ENV_ENGINE, ENV_COMPOSE, ENV_IMAGE, ENV_PYTHON, ENV_REDIS, ENV_PROMETHEUS)
    if not all(os.environ.get(n) for n in names):
        return None
    images = {
        "proxy": os.environ[ENV_IMAGE],
        "python": os.environ[ENV_PYTHON],
        "redis": os.environ[ENV_REDIS],
        "prometheus": os.environ[ENV_PROMETHEUS],
    }
    return Engine(os.environ[ENV_ENGINE]), tuple(shlex.split(os.environ[ENV_COMPOSE])), images
