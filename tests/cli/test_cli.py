"""The ``trimproxy`` command as an operator meets it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from proxy.settings import Settings
from tests.support.demo import DemoProcess


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRIMPROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_every_command() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("serve", "sim"):
        assert command in out.stdout


def test_serve_help_lists_every_setting_with_its_meaning() -> None:
    out = run_cli("serve", "--help")
    assert out.returncode == 0
    for name, field in Settings.model_fields.items():
        assert f"TRIMPROXY_{name.upper()}" in out.stdout
        assert field.description, f"{name} has no description"
        assert field.description.split()[0] in out.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TRIMPROXY_PORT", "not-a-port"),
        ("TRIMPROXY_TRIM_TARGET", "1.5"),
        ("TRIMPROXY_TOKENIZER", "sentencepiece"),
        ("TRIMPROXY_UPSTREAM_URL", "ftp://host"),
        ("TRIMPROXY_SESSION_LIMIT_ACTION", "explode"),
        ("TRIMPROXY_API_KEYS", " , "),
        ("TRIMPROXY_REDIS_URL", "localhost:6379"),
    ],
)
def test_bad_setting_stops_start_up_with_one_line_naming_it(variable: str, value: str) -> None:
    out = run_cli("serve", env={variable: value})
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert variable in lines[0]
    assert "Traceback" not in out.stderr


def test_upstream_url_trailing_v1_is_dropped() -> None:
    settings = Settings(upstream_url="http://10.0.0.5:8000/v1/")
    assert settings.upstream_url == "http://10.0.0.5:8000"


def test_serve_demo_answers_chat_and_stops_its_upstream() -> None:
    """The README's first command: the proxy in front of an embedded simulated vLLM."""
    with DemoProcess() as demo:
        r = httpx.post(
            f"{demo.url}/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert int(r.headers["x-trimproxy-prompt-tokens"]) > 0
        assert demo.stop_with(signal.SIGINT) == 0, demo.logs()
        (upstream,) = demo.upstreams()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{upstream}/health", timeout=2)
