"""``trimproxy soak`` as a child process, and its output folder read back.

Shared by the soak tests against the sim (tests/soak) and against the real vLLM engine
(tests/e2e/test_soak_vllm.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import REPO_ROOT, child_env

SOAK_TIMEOUT = 600.0


@dataclass
class Soak:
    """A finished run: exit status, output folder, everything it printed."""

    rc: int
    out: Path
    output: str

    @property
    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return data

    def requests(self, arm: str | None = None) -> list[dict[str, Any]]:
        lines = (self.out / "requests.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        return [r for r in rows if arm is None or r["arm"] == arm]

    def lane(self, arm: str, conversation: int) -> list[dict[str, Any]]:
        """One lane's requests in the order it sent them."""
        rows = [r for r in self.requests(arm) if r["conversation"] == conversation]
        return sorted(rows, key=lambda r: r["start"])

    def samples(self) -> list[dict[str, Any]]:
        lines = (self.out / "samples.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def soak(out: Path, *args: str, timeout: float = SOAK_TIMEOUT) -> Soak:
    """``python -m proxy.cli soak --out OUT ARGS...``, the way an operator runs it."""
    command = [sys.executable, "-m", "proxy.cli", "soak", "--out", str(out), *args]
    done = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=child_env({"COLUMNS": "120"}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Soak(done.returncode, out, done.stdout + done.stderr)


def assert_sawtooth(run: Soak, conversations: int, turns: int, max_turns: int) -> None:
    """Every lane of the target arm: the client's history only grows, while what the
    engine receives falls back to the first turn's size at each session reset."""
    for lane in range(conversations):
        rows = run.lane("target", lane)
        assert [r["turn"] for r in rows] == list(range(1, turns + 1)), rows
        sent = [r["sent_prompt_tokens"] for r in rows]
        forwarded = [r["forwarded_prompt_tokens"] for r in rows]
        assert all(isinstance(n, int) for n in sent + forwarded), rows
        assert sent == sorted(sent) and len(set(sent)) == turns
        resets = [turn for turn in range(1, turns + 1) if turn > 1 and turn % max_turns == 1]
        assert [r["turn"] for r in rows if r["session_reset"]] == resets
        first = forwarded[0]
        for turn in resets:
            assert forwarded[turn - 1] < forwarded[turn - 2]
            assert abs(forwarded[turn - 1] - first) <= 0.1 * first, forwarded
        assert max(forwarded) < sent[-1]
