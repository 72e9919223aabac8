"""The ``soak`` command's surface: help, flag checks, the missing optional extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO_ROOT, child_env


def trimproxy(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}\nfrom proxy.cli import main\nraise SystemExit(main({list(args)!r}))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_soak_and_its_flags() -> None:
    assert "soak" in trimproxy("--help").stdout
    text = trimproxy("soak", "--help").stdout
    for flag in ("--target", "--compare", "--model", "--conversations", "--turn-tokens",
                 "--max-tokens", "--duration", "--turns", "--metrics-url", "--engine-metrics",
                 "--session-header",
                 "--out", "--max-kv-usage", "--seed", "--api-key"):  # fmt: skip
        assert flag in text, flag


def test_duration_and_turns_exclude_each_other_and_fractions_are_checked() -> None:
    both = trimproxy("soak", "--target", "http://x", "--model", "m", "--duration", "5",
                     "--turns", "2")  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr
    percent = trimproxy("soak", "--target", "http://x", "--model", "m", "--max-kv-usage", "90")
    assert percent.returncode == 2 and "0.9 means 90 %" in percent.stderr


def test_missing_extra_says_how_to_install_it() -> None:
    # As if matplotlib were not installed: the import fails, the command explains.
    run = trimproxy("soak", "--target", "http://127.0.0.1:9", "--model", "m", "--turns", "1",
                    prelude="import sys; sys.modules['matplotlib'] = None")  # fmt: skip
    assert run.returncode == 2
    assert "pip install 'trimproxy[soak]'" in run.stderr


def test_target_that_is_not_there(tmp_path: Path) -> None:
    run = trimproxy("soak", "--target", "http://127.0.0.1:9", "--model", "m", "--turns", "1",
                    "--out", str(tmp_path))  # fmt: skip
    assert run.returncode == 2
    assert "http://127.0.0.1:9 did not answer GET /v1/models" in run.stderr
