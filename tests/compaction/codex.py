"""The real Codex CLI (from npm, in ``.cache/codex-npm``; ``scripts/test.sh`` installs
it when npm is there) with its built-in OpenAI provider pointed at a proxy."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODEX = REPO / ".cache" / "codex-npm" / "node_modules" / ".bin" / "codex"
MISSING = (
    f"the Codex CLI is not installed at {CODEX.relative_to(REPO)}: "
    "npm install --prefix .cache/codex-npm @openai/codex (scripts/test.sh does it when npm "
    "is on PATH)"
)
TURN_TIMEOUT = 180.0
#: What Codex prints when the Responses WebSocket fails and it falls back to HTTPS.
FALLBACK = ("failed to connect to Responses WebSocket", "Reconnecting")


@dataclass
class Codex:
    home: Path
    work: Path
    #: A hang guard for one turn, not a measurement.
    timeout: float = TURN_TIMEOUT

    @classmethod
    def configured(
        cls, root: Path, api_base: str, model: str, window: int, timeout: float = TURN_TIMEOUT
    ) -> Codex:
        codex = cls(root / "home", root / "work", timeout)
        codex.home.mkdir()
        codex.work.mkdir()
        codex.configure(api_base, model, window, None)
        login = codex.run(["login", "--with-api-key"], stdin="key-codex\n")
        assert login.returncode == 0, login.stdout
        return codex

    def configure(self, api_base: str, model: str, window: int, compact_at: int | None) -> None:
        lines = [
            f'model = "{model}"',
            f'openai_base_url = "{api_base}"',
            f"model_context_window = {window}",
            'approval_policy = "never"',
            'sandbox_mode = "read-only"',
        ]
        if compact_at is not None:
            lines.append(f"model_auto_compact_token_limit = {compact_at}")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def run(self, args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CODEX_HOME": str(self.home), "NO_COLOR": "1"}
        return subprocess.run(
            [str(CODEX), *args],
            cwd=self.work,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )

    def turn(self, prompt: str, first: bool) -> subprocess.CompletedProcess[str]:
        """One turn of the session (``codex exec``, then ``resume --last``)."""
        args = ["exec", "--skip-git-repo-check"]
        args += [prompt] if first else ["resume", "--last", prompt]
        done = self.run(args)
        done.stdout += done.stderr
        return done
