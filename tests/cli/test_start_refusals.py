"""What ``trimproxy serve`` refuses before it starts: a tokenizer that cannot work, a
context window the completion reserve fills, demo flags that contradict each other, a
bad value from a file. Each is one line on stderr naming the setting and the fix, and
exit 2, as every bad setting is; never a traceback, never a server that 400s every
request."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import child_env
from tests.support.sim import SimUpstream, start_sim_thread


def serve(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``trimproxy serve`` as a process; the tests below expect it to exit by itself
    (the timeout is a hang guard: a server that started is a failure)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", *args],
        env=child_env({"TRIMPROXY_PORT": "1", **(env or {})}),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("trimproxy: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def fastchat() -> Iterator[SimUpstream]:
    sim = start_sim_thread("fastchat")
    try:
        yield sim
    finally:
        sim.stop()


def test_tiktoken_without_its_file_offline_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "tiktoken-cache"
    empty.mkdir()
    line = one_line(
        serve(env={"TRIMPROXY_TOKENIZER": "tiktoken:cl100k_base", "TIKTOKEN_CACHE_DIR": str(empty)})
    )
    assert "TRIMPROXY_TOKENIZER=tiktoken:cl100k_base" in line
    assert "TIKTOKEN_CACHE_DIR" in line and "cl100k_base.tiktoken" in line


def test_an_unknown_tiktoken_encoding_is_one_line() -> None:
    line = one_line(serve(env={"TRIMPROXY_TOKENIZER": "tiktoken:foo"}))
    assert "TRIMPROXY_TOKENIZER=tiktoken:foo: unknown encoding" in line
    assert "cl100k_base" in line  # the names it knows


def test_upstream_tokenizer_in_front_of_fastchat_is_one_line(fastchat: SimUpstream) -> None:
    line = one_line(
        serve(env={"TRIMPROXY_TOKENIZER": "upstream", "TRIMPROXY_UPSTREAM_URL": fastchat.url})
    )
    assert "TRIMPROXY_TOKENIZER=upstream" in line and "POST /tokenize" in line
    assert "hf:" in line  # the fix
    assert fastchat.requests("/tokenize")  # it asked, before refusing


def test_upstream_tokenizer_of_a_models_file_table_names_the_table(
    fastchat: SimUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'[models."m"]\ntokenizer = "upstream"\nupstream_url = "{fastchat.url}"\n')
    out = serve(env={"TRIMPROXY_TOKENIZER": "approx", "TRIMPROXY_MODELS_FILE": str(path)})
    line = one_line(out)
    assert line.startswith(f'trimproxy: TRIMPROXY_MODELS_FILE={path}: [models."m"]: tokenizer')
    assert "POST /tokenize" in line


def test_a_models_file_tiktoken_encoding_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models."m"]\ntokenizer = "tiktoken:foo"\n')
    out = serve(env={"TRIMPROXY_TOKENIZER": "approx", "TRIMPROXY_MODELS_FILE": str(path)})
    line = one_line(out)
    assert '[models."m"]: tokenizer = "tiktoken:foo": unknown encoding' in line


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"TRIMPROXY_CONTEXT_WINDOW": "100"}, ("CONTEXT_WINDOW=100", "DEFAULT_COMPLETION_RESERVE")),
        (
            {"TRIMPROXY_CONTEXT_WINDOW": "600", "TRIMPROXY_DEFAULT_COMPLETION_RESERVE": "599"},
            ("CONTEXT_WINDOW=600", "DEFAULT_COMPLETION_RESERVE=599"),
        ),
        (
            {"TRIMPROXY_CONTEXT_WINDOW": "4096", "TRIMPROXY_MAX_COMPLETION_TOKENS": "4096"},
            ("CONTEXT_WINDOW=4096", "MAX_COMPLETION_TOKENS=4096"),
        ),
    ],
)
def test_a_window_the_completion_reserve_fills_is_refused(
    env: dict[str, str], names: tuple[str, ...]
) -> None:
    line = one_line(serve(env=env))
    for name in names:
        assert f"TRIMPROXY_{name}" in line, line


def test_a_models_file_window_the_reserve_fills_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models."small"]\ncontext_window = 100\n')
    line = one_line(serve(env={"TRIMPROXY_MODELS_FILE": str(path)}))
    assert '[models."small"]: ' in line
    assert "CONTEXT_WINDOW=100" in line and "DEFAULT_COMPLETION_RESERVE=512" in line


def test_demo_refuses_an_upstream_url_it_would_ignore() -> None:
    line = one_line(serve("--demo", "--upstream-url", "http://10.0.0.5:8000"))
    assert "--demo" in line and "--upstream-url" in line


def test_demo_with_no_engines_names_engines() -> None:
    line = one_line(serve("--demo", "--engines", "0"))
    assert line.startswith("trimproxy: --engines 0: ")


def test_a_bad_value_from_dot_env_says_it_came_from_there(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TRIMPROXY_TRIM_TARGET=7\n")
    line = one_line(serve(cwd=tmp_path))
    assert "invalid TRIMPROXY_TRIM_TARGET (from ./.env): " in line
    # The same value from the environment is the environment's: no file named.
    line = one_line(serve(env={"TRIMPROXY_TRIM_TARGET": "7"}, cwd=tmp_path))
    assert "invalid TRIMPROXY_TRIM_TARGET: " in line


def test_a_bad_value_from_an_env_file_names_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / "proxy.env"
    env_file.write_text("TRIMPROXY_CONTEXT_WINDOW=100\n")
    line = one_line(serve("--env-file", str(env_file), cwd=tmp_path))
    assert f"TRIMPROXY_CONTEXT_WINDOW from {env_file}" in line


@pytest.mark.parametrize(
    ("value", "why"),
    [("-1", "greater than or equal to 0"), ("9", "less than or equal to 8"), ("once", "integer")],
)
def test_a_bad_continue_attempts_is_one_line(value: str, why: str) -> None:
    line = one_line(serve(env={"TRIMPROXY_CONTINUE_ATTEMPTS": value}))
    assert "invalid TRIMPROXY_CONTINUE_ATTEMPTS" in line and why in line


def test_a_tokenizer_that_fails_only_once_loaded_is_one_line_too(tmp_path: Path) -> None:
    """The start-up check finds the files of ``hf:<dir>``; loading them, which only the
    lifespan does, fails. Still one line naming the setting, and exit 2, not the
    server's traceback and exit 3 (the server's own log lines come before it)."""
    (tmp_path / "tokenizer.json").write_text("{not json")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    setting = f"hf:{tmp_path}"
    out = serve(
        env={
            "TRIMPROXY_TOKENIZER": setting,
            "TRIMPROXY_CONTEXT_WINDOW": "4096",
            "TRIMPROXY_UPSTREAM_URL": "http://127.0.0.1:9",
        }
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"trimproxy: TRIMPROXY_TOKENIZER={setting}: cannot load"), last
