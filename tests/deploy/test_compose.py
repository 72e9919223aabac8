"""deploy/compose against the compose-spec JSON schema and against the code it runs.

No container engine runs here: ``docker compose config`` and ``up`` are the operator's.
These check what would break them, or break the stack once up: the file is valid
compose, every variable it reads is listed in .env.example, every TRIMPROXY_* value
validates as a setting, each profile brings one engine answering as ``upstream``, the
proxy reads the engine's Hugging Face cache read-only, Grafana and Prometheus find their
files where the stack mounts them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import check_jsonschema
import jsonschema
import yaml

from proxy.settings import Settings
from tests.deploy.kit import (
    COMPOSE,
    COMPOSE_DIR,
    ENV_EXAMPLE,
    ROOT,
    TRIMPROXY_NAME,
    env_file,
    validate_settings,
)

SCHEMA = Path(check_jsonschema.__file__).parent / "builtin_schemas/vendor/compose-spec.json"
PROFILES = ("vllm", "vllm-cpu", "fastchat")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^${}]*))?\}")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}``, innermost first (defaults may nest)."""
    while True:
        replaced = VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value, count=1)
        if replaced == value:
            return value
        value = replaced


def example_env() -> dict[str, str]:
    return env_file(ENV_EXAMPLE)


def test_the_file_is_valid_compose() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, errors
    bad = compose()
    bad["services"]["trimproxy"]["enviroment"] = {}
    assert list(validator.iter_errors(bad)), "the schema must reject an unknown key"


def test_every_variable_the_file_reads_is_listed_in_env_example() -> None:
    text = ENV_EXAMPLE.read_text()
    listed = set(re.findall(r"^#?([A-Za-z_][A-Za-z0-9_]*)=", text, flags=re.MULTILINE))
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE.read_text()))
    assert used - listed == set(), f"add to .env.example: {sorted(used - listed)}"


def test_env_example_lists_every_setting_and_its_values_validate() -> None:
    text = ENV_EXAMPLE.read_text()
    for name in Settings.model_fields:
        assert re.search(rf"^#?TRIMPROXY_{name.upper()}=", text, flags=re.MULTILINE), name
    env = example_env()
    settings = validate_settings(
        {k: v for k, v in env.items() if k.startswith("TRIMPROXY_")}, "env"
    )
    # Uncommented lines hold the proxy's defaults: copying the file changes nothing.
    assert settings == Settings(_env_file=None)
    assert env["COMPOSE_PROFILES"] in PROFILES


def test_the_proxy_environment_validates_with_the_example_values() -> None:
    env = example_env()
    proxy = services()["trimproxy"]
    values = {k: interpolate(str(v), env) for k, v in proxy["environment"].items()}
    settings = validate_settings(values, "compose.yaml trimproxy.environment")
    assert settings.host == "0.0.0.0" and settings.upstream_url == "http://upstream:8000"
    assert settings.tokenizer == f"hf:{env['MODEL']}"
    assert settings.redis_url == "redis://redis:6379/0" and "redis" in services()
    for name in TRIMPROXY_NAME.findall(COMPOSE.read_text()):
        assert name[len("TRIMPROXY_") :].lower() in Settings.model_fields, name
    assert proxy["env_file"] == [{"path": ".env", "required": False}]
    # Prometheus scrapes every replica of the service, on the port the proxy listens on.
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "trimproxy"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["trimproxy"] and "trimproxy" in services()
    assert (sd["type"], sd["port"]) == ("A", settings.port)
    assert proxy["ports"][0].endswith(f":{settings.port}")


def _cache_mount(service: dict[str, Any]) -> tuple[str, str, str]:
    (mount,) = [v for v in service.get("volumes", []) if "HF_CACHE" in v]
    variable, _, rest = mount.partition("}:")
    target, _, mode = rest.partition(":")
    return variable + "}", target, mode or "rw"


def test_each_profile_brings_one_engine_answering_as_upstream() -> None:
    found = services()
    always = {name for name, s in found.items() if "profiles" not in s}
    assert always == {"trimproxy", "redis", "prometheus", "grafana"}
    for profile in PROFILES:
        members = {n: s for n, s in found.items() if profile in s.get("profiles", [])}
        upstreams = [
            n
            for n, s in members.items()
            if "upstream" in s.get("networks", {}).get("default", {}).get("aliases", [])
        ]
        assert len(upstreams) == 1, (profile, upstreams)
        (engine,) = upstreams
        # The proxy waits for the profile's engine to be healthy (the model, and so its
        # tokenizer, is in the cache by then) and ignores the engines of other profiles.
        dependency = found["trimproxy"]["depends_on"][engine]
        assert dependency == {"condition": "service_healthy", "required": False}
        assert "healthcheck" in members[engine]
    fastchat = {n for n, s in found.items() if "fastchat" in s.get("profiles", [])}
    assert fastchat == {"fastchat-controller", "fastchat-worker", "fastchat-api"}
    gpu = found["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    assert "vllm-openai-cpu" in found["vllm-cpu"]["image"]


def test_the_proxy_shares_the_engines_hf_cache_read_only() -> None:
    found = services()
    proxy_mount = _cache_mount(found["trimproxy"])
    assert proxy_mount[1:] == ("/hf", "ro")
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "HF_HUB_CACHE=/hf/hub" in dockerfile and "HF_HUB_OFFLINE=1" in dockerfile
    for engine, home in (
        ("vllm", "/root/.cache/huggingface"),
        ("vllm-cpu", "/root/.cache/huggingface"),
        ("fastchat-worker", "/hf"),
    ):
        source, target, mode = _cache_mount(found[engine])
        assert (source, target, mode) == (proxy_mount[0], home, "rw"), engine
    assert found["fastchat-worker"]["environment"]["HF_HOME"] == "/hf"


def test_images_are_pinned_and_the_proxy_is_locked_down() -> None:
    found = services()
    for name, service in found.items():
        image = interpolate(service["image"], example_env())
        assert ":" in image and not image.endswith(":latest"), (name, image)
        # Images of this repository exist on no registry: each such service builds it.
        if image.startswith("trimproxy"):
            assert service["build"]["dockerfile"].startswith("docker/"), name
    assert re.search(r"@sha256:[0-9a-f]{64}$", found["redis"]["image"])
    proxy = found["trimproxy"]
    assert proxy["read_only"] is True and proxy["cap_drop"] == ["ALL"]
    assert proxy["user"] == "10001:10001"
    assert "no-new-privileges:true" in proxy["security_opt"]
    assert proxy["build"] == {"context": "../..", "dockerfile": "docker/Dockerfile"}


def test_grafana_and_prometheus_find_their_files() -> None:
    found = services()
    for service in ("prometheus", "grafana"):
        for volume in found[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), (service, source)
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/trimproxy.yml").read_text()
    )["providers"][0]
    mounts = [v.split(":")[1] for v in found["grafana"]["volumes"]]
    assert any(m.startswith(provider["options"]["path"] + "/") for m in mounts)
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and datasource["isDefault"] is True
