"""The container and Kubernetes files agree with the code they deploy.

No container engine or cluster runs here, so these check what can drift silently:
every setting they set exists and validates, the probes hit real routes, the ports
line up, and the image's entry point is the installed command.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from proxy.routes import routes
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kubernetes" / "trimproxy.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def trimproxy_container() -> dict[str, Any]:
    deployment = next(
        d for d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "trimproxy"
    )
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def config() -> dict[str, str]:
    data: dict[str, str] = next(d for d in documents() if d["kind"] == "ConfigMap")["data"]
    return data


def field_of(variable: str) -> str:
    assert variable.startswith("TRIMPROXY_"), variable
    return variable[len("TRIMPROXY_") :].lower()


def test_every_configured_setting_exists_and_validates() -> None:
    variables = list(config())
    variables += [e["name"] for e in trimproxy_container().get("env", [])]
    for variable in variables:
        assert field_of(variable) in Settings.model_fields, variable
    settings = Settings(**{field_of(k): v for k, v in config().items()})  # type: ignore[arg-type]
    assert settings.redis_url and settings.session_max_turns


def test_probes_and_ports_match_the_routes() -> None:
    paths = {route.path for route in routes}  # type: ignore[attr-defined]
    container = trimproxy_container()
    assert container["readinessProbe"]["httpGet"]["path"] in paths
    assert container["livenessProbe"]["httpGet"]["path"] in paths
    (port,) = container["ports"]
    dockerfile = DOCKERFILE.read_text()
    assert f"TRIMPROXY_PORT={port['containerPort']}" in dockerfile
    assert f"EXPOSE {port['containerPort']}" in dockerfile
    template = next(d for d in documents() if d["kind"] == "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/path"] in paths


def test_image_runs_the_installed_command_on_the_copied_sources() -> None:
    dockerfile = DOCKERFILE.read_text()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert 'ENTRYPOINT ["trimproxy", "serve"]' in dockerfile and "trimproxy" in scripts
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, flags=re.MULTILINE):
        for name in source.split():
            assert (ROOT / name).exists(), name
    # torch would pull a multi-GB build; the image needs tokenizers only.
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.startswith("torch") for d in dependencies)
