"""The operator's first hour at start-up: one clear line and exit 2 for what cannot
work, JSON log lines for everything else, the version, settings typos named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import proxy
from tests.observability.promtext import parse
from tests.support.processes import ProxyProcess, child_env
from tests.support.sim import SimUpstream
from tests.support.tiny_model import build_tokenizer


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args],
        env=child_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trimproxy {proxy.__version__}\n"


def test_a_bad_models_file_stops_start_up_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models."qwen"]\nupstream_url = "http://10.0.0.5:8000"\nmax_prompt_tokens = -3\n'
    )
    out = run_cli("serve", env={"TRIMPROXY_MODELS_FILE": str(path)})
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"trimproxy: TRIMPROXY_MODELS_FILE={path}: ")
    assert '[models."qwen"]: max_prompt_tokens:' in lines[0]


def test_several_workers_with_session_limits_need_redis() -> None:
    out = run_cli("serve", "--workers", "2", env={"TRIMPROXY_SESSION_MAX_TURNS": "3"})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "TRIMPROXY_REDIS_URL" in out.stderr and "2 workers" in out.stderr


def test_env_file_is_read(tmp_path: Path) -> None:
    env_file = tmp_path / "proxy.env"
    # An invalid value proves the file was read, without starting a server.
    env_file.write_text("TRIMPROXY_MAX_PROMPT_TOKENS=0\n")
    out = run_cli("serve", "--env-file", str(env_file))
    assert out.returncode == 2
    assert "invalid TRIMPROXY_MAX_PROMPT_TOKENS" in out.stderr
    # The environment wins over the file, as it does over ./.env.
    out = run_cli("serve", "--env-file", str(env_file), env={"TRIMPROXY_MAX_PROMPT_TOKENS": "x"})
    assert "invalid TRIMPROXY_MAX_PROMPT_TOKENS: Input should be a valid integer" in out.stderr
    missing = run_cli("serve", "--env-file", str(tmp_path / "nope.env"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr


def test_dot_env_is_read_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TRIMPROXY_PORT=0\n")
    out = run_cli("serve", cwd=tmp_path)
    assert out.returncode == 2
    assert "invalid TRIMPROXY_PORT" in out.stderr


@pytest.fixture(scope="module")
def tokenizer_with_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer beside a model config.json of the kind that makes transformers
    talk (keys it does not know in the rope parameters)."""
    path = build_tokenizer(tmp_path_factory.mktemp("tok"))
    config = {
        "model_type": "llama",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1]},
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_start_with_an_hf_tokenizer_logs_json_only(
    sim_upstream: SimUpstream, tokenizer_with_config: Path, tmp_path: Path
) -> None:
    # A typo in the environment, and one in ./.env of the working directory.
    (tmp_path / ".env").write_text("TRIMPROXY_PIN_FIRST_USR=true\n")
    server = ProxyProcess(
        settings={"tokenizer": f"hf:{tokenizer_with_config}", "upstream_metrics_interval": 0},
        env={"TRIMPROXY_UPSTREAM_URL": sim_upstream.url, "TRIMPROXY_TRIMTARGET": "0.5"},
        workdir=tmp_path,
    )
    with server:
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        metrics = parse(httpx.get(f"{server.url}/metrics", timeout=10))
        assert metrics.value("trimproxy_build_info", version=proxy.__version__) == 1
    log = server.logs()
    records = []
    for line in log.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a log line that is not JSON: {line!r}\n--- log ---\n{log}")
    assert records
    assert "PyTorch was not found" not in log and "rope_parameters" not in log
    warnings = [r["msg"] for r in records if r["logger"] == "trimproxy.settings"]
    assert (
        "TRIMPROXY_TRIMTARGET is not a trimproxy setting and is ignored; did you mean "
        "TRIMPROXY_TRIM_TARGET?" in warnings
    )
    assert any("TRIMPROXY_PIN_FIRST_USR" in w and "TRIMPROXY_PIN_FIRST_USER" in w for w in warnings)
    assert any(r["logger"] == "trimproxy.access" for r in records)


def test_unknown_variables_name_the_closest_setting() -> None:
    from proxy.settings import unknown_variables

    found = unknown_variables(
        ["TRIMPROXY_MAX_PROMT_TOKENS", "TRIMPROXY_PORT", "PATH", "TRIMPROXY_QQQQQQ"]
    )
    assert found == [
        "TRIMPROXY_MAX_PROMT_TOKENS is not a trimproxy setting and is ignored; did you mean "
        "TRIMPROXY_MAX_PROMPT_TOKENS?",
        "TRIMPROXY_QQQQQQ is not a trimproxy setting and is ignored",
    ]
    assert os.environ.get("TRIMPROXY_QQQQQQ") is None
