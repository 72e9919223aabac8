"""A real ``redis-server`` process on a free loopback port, for the session tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from tests.support.processes import free_port

REDIS_BIN = shutil.which("redis-server")


class RedisServer:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        log = (self.workdir / "redis.log").open("ab")
        with log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on {self.port}: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def client(self) -> redis.Redis:
        """A synchronous client for inspecting the server; close it after use."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def log_tail(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
