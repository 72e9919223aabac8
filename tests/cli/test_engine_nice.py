"""The tests' engines yield the CPU (``processes.start_process(..., nice=)``).

On two shared cores a busy CPU engine left the proxy under test runnable but
unscheduled for seconds; ``tests/e2e`` starts its engines at ``ENGINE_NICE``. This
checks that the child really runs at that nice value, and, where the kernel groups
sessions (autogroup), that its session's group does too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.processes import child_env, start_process, stop_process_group


def _nice_of(pid: int) -> int:
    # /proc/<pid>/stat: field 19 is the nice value; the name (field 2) may hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def _wait_for_exec(pid: int, argv: list[str]) -> None:
    # Until the child runs ``argv`` itself it may still be the forked test process or
    # ``nice``, which sets the value and then execs the command: both at the parent's
    # value. Only the command's own command line says the value is final.
    want = b"".join(arg.encode() + b"\0" for arg in argv)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").read_bytes() != want:
        assert time.monotonic() < deadline, "the child never ran its command"
        time.sleep(0.01)


def _sleeper(tmp_path: Path, nice: int = 0) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = start_process(
        "sleeper", argv, log=tmp_path / "sleeper.log", env=child_env({}), cwd=tmp_path, nice=nice
    )
    _wait_for_exec(proc.pid, argv)
    return proc


def test_a_niced_child_and_its_session_run_at_that_value(tmp_path: Path) -> None:
    proc = _sleeper(tmp_path, nice=10)
    try:
        assert _nice_of(proc.pid) == 10
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == "10", autogroup.read_text()
    finally:
        stop_process_group(proc, grace=2.0)


def test_a_child_without_nice_keeps_the_parents(tmp_path: Path) -> None:
    proc = _sleeper(tmp_path)
    try:
        assert _nice_of(proc.pid) == _nice_of(os.getpid())
    finally:
        stop_process_group(proc, grace=2.0)
