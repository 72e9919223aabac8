"""The README's first hour, as pasted: the two-command block keeps its promise, and
the client snippet runs against the demo (``trimproxy serve --demo``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.demo import DemoProcess
from tests.support.processes import REPO_ROOT, child_env

README = REPO_ROOT / "README.md"
DEMO_URL = "http://127.0.0.1:8080"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text("utf-8"), re.S)


def test_the_first_block_sets_up_and_starts_the_demo_then_runs_the_tests() -> None:
    lines = blocks("bash")[0].splitlines()
    first = [line for line in lines if not line.startswith("#")]
    assert len(first) == 2, first
    setup, tests = first
    # Before the suite's command, the block says what it costs and offers the fast loop.
    said = " ".join(line for line in lines[: lines.index(tests)] if line.startswith("#"))
    assert "minutes" in said and "apt-get" in said, said
    assert "bash scripts/test.sh --fast" in said, said
    assert "pip install -e ." in setup and "openai" in setup.split("&&")[1]
    # The server goes to the background: the line ends, and the second one runs.
    assert re.search(r"\{ \.venv/bin/trimproxy serve --demo [^}]*& \}$", setup), setup
    assert tests == "bash scripts/test.sh"
    ci = (REPO_ROOT / ".ci" / "run").read_text("utf-8")
    # The README's test command runs first and alone on its line (a failure stops CI:
    # set -e), then the container test.
    assert re.search(r"^(exec )?bash scripts/test\.sh$", ci, re.MULTILINE), ci
    assert "set -euo pipefail" in ci
    assert ".[test]" in (REPO_ROOT / "scripts" / "test.sh").read_text("utf-8")


def test_the_client_snippet_runs_as_pasted_against_the_demo(tmp_path: Path) -> None:
    snippet = blocks("python")[0]
    assert DEMO_URL in snippet and "history = [" in snippet
    with DemoProcess() as demo:
        # Only the port differs: the tests must not take the demo's 8080.
        script = tmp_path / "snippet.py"
        script.write_text(snippet.replace(DEMO_URL, demo.url))
        out = subprocess.run(
            [sys.executable, str(script)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    assert "simulated upstream" in out.stdout
