"""The forms of TRIMPROXY_UPSTREAM_URL, and refusing a bad one at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from proxy.engines.urls import EngineUrl, parse_upstream
from proxy.models import load_models
from proxy.settings import Settings
from tests.models.test_startup import run_cli


def test_one_or_several_engines_normalised() -> None:
    assert Settings(upstream_url="http://a:8000/v1/").upstream_url == "http://a:8000"
    s = Settings(upstream_url=" http://a:8000 , https://b:9000/v1")
    assert s.upstream_url == "http://a:8000,https://b:9000"
    assert parse_upstream("dns+http://vllm.ns.svc:8000") == (
        EngineUrl("http://vllm.ns.svc:8000", dns=True),
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("http://a:1,http://a:1", "listed twice"),
        ("http://a:1,10.0.0.2:8000", "must start with http://"),
        (" , ", "names no engine"),
        ("http://a:1?x=1", "no query"),
        ("dns+http://vllm.ns.svc", "names the engines' port"),
    ],
)
def test_a_bad_value_is_refused(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(upstream_url=value)
    assert says in str(info.value)


def test_a_bad_list_stops_start_up_with_one_line() -> None:
    out = run_cli("serve", env={"TRIMPROXY_UPSTREAM_URL": "http://127.0.0.1:1,127.0.0.1:2"})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("trimproxy: invalid TRIMPROXY_UPSTREAM_URL: ")


def test_the_models_file_takes_a_list_and_a_kv_admission(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models."m"]\nupstream_url = ["http://10.0.0.5:8000", "http://10.0.0.6:8000/v1"]\n'
        "kv_admission = 4096\n"
    )
    (model,) = load_models(Settings(models_file=str(path)))
    assert model.settings.upstream_url == "http://10.0.0.5:8000,http://10.0.0.6:8000"
    assert model.settings.kv_admission == "4096"
