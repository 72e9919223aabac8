"""The deploy kit's files, read the way the tests need them, and the files generated
from others (so that two copies cannot drift apart).

Generated: ``deploy/kubernetes/monitoring/prometheusrule.yaml`` (from
``deploy/prometheus/trimproxy-rules.yml``), ``deploy/kubernetes/monitoring/
grafana-dashboard.yaml`` (from ``deploy/grafana/trimproxy-dashboard.json``) and
``deploy/compose/.env.example`` (from ``proxy.settings.Settings``). Rewrite them with
``python -m tests.deploy.kit``; the tests fail, naming that command, when they are stale.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from proxy.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
DASHBOARD = DEPLOY / "grafana" / "trimproxy-dashboard.json"
RULES = DEPLOY / "prometheus" / "trimproxy-rules.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERFILES = (DOCKERFILE, ROOT / "docker" / "fastchat" / "Dockerfile")
PROMETHEUS_RULE = KUBE / "monitoring" / "prometheusrule.yaml"
DASHBOARD_CONFIGMAP = KUBE / "monitoring" / "grafana-dashboard.yaml"
REGENERATE = "python -m tests.deploy.kit"
#: Kubernetes versions every object is validated against: the oldest still supported by
#: the big managed offerings when this was written, and the newest the validator knows.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
TRIMPROXY_NAME = re.compile(r"\bTRIMPROXY_[A-Z0-9_]+\b")
_LABELS = {"app.kubernetes.io/name": "trimproxy", "app.kubernetes.io/component": "monitoring"}


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest of the kit, examples and monitoring included."""
    return sorted(p for p in KUBE.rglob("*.yaml") if p.is_file())


def kube_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def kube_object(kind: str, name: str) -> dict[str, Any]:
    for _, obj in kube_objects():
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise LookupError(f"no {kind} {name!r} under {KUBE}")


def field_of(variable: str) -> str:
    assert variable.startswith(ENV_PREFIX), variable
    return variable[len(ENV_PREFIX) :].lower()


def validate_settings(values: dict[str, str], where: str) -> Settings:
    """``values`` (``TRIMPROXY_*`` -> text) as the proxy would read them; fails naming
    ``where`` for a name that is no setting or a value that does not validate."""
    unknown = sorted(k for k in values if field_of(k) not in Settings.model_fields)
    assert not unknown, f"{where}: not settings of proxy/settings.py: {unknown}"
    return Settings(**{field_of(k): v for k, v in values.items()})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- generated


def _literal_blocks(dumper: Any, value: str) -> Any:
    """Multi-line strings (PromQL, descriptions) as literal blocks, as they were written."""
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _dump(header: str, obj: dict[str, Any]) -> str:
    dumper: Any = type("Dumper", (yaml.SafeDumper,), {})
    dumper.add_representer(str, _literal_blocks)
    body: str = yaml.dump(obj, Dumper=dumper, sort_keys=False, width=100, allow_unicode=True)
    return header + body


def prometheus_rule_text() -> str:
    rules = yaml.safe_load(RULES.read_text())
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "trimproxy", "labels": dict(_LABELS)},
        "spec": {"groups": rules["groups"]},
    }
    header = (
        "# GENERATED from deploy/prometheus/trimproxy-rules.yml (the file promtool tests):\n"
        f"# edit that one, then run `{REGENERATE}`. Needs prometheus-operator's CRDs.\n"
    )
    return _dump(header, obj)


def dashboard_configmap_text() -> str:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "trimproxy-dashboard",
            # Grafana's dashboard sidecar (kube-prometheus-stack, the Grafana chart)
            # loads every ConfigMap with this label.
            "labels": {**_LABELS, "grafana_dashboard": "1"},
        },
        "data": {"trimproxy-dashboard.json": DASHBOARD.read_text()},
    }
    header = (
        "# GENERATED from deploy/grafana/trimproxy-dashboard.json: edit that one, then run\n"
        f"# `{REGENERATE}`. Grafana's sidecar picks it up by its grafana_dashboard label.\n"
    )
    return _dump(header, obj)


#: Settings that compose.yaml sets itself: its value there, and why.
COMPOSE_SET = {
    "host": ("0.0.0.0", "fixed by compose.yaml: the container listens beyond its loopback"),
    "port": ("8080", "fixed by compose.yaml; set PROXY_HOST_PORT for another host port"),
    "upstream_url": ("http://upstream:8000", "the profile's engine"),
    "redis_url": ("redis://redis:6379/0", "the stack's Redis"),
    "tokenizer": ("hf:${MODEL}", "the model's tokenizer from the shared cache"),
}


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def env_example_text() -> str:
    lines = [
        "# deploy/compose settings: copy to .env next to compose.yaml and edit.",
        f"# GENERATED from proxy/settings.py by `{REGENERATE}`: every TRIMPROXY_* knob with",
        "# its default. A commented line is unset (the proxy's default applies).",
        "",
        "# --- the stack ------------------------------------------------------------------",
        "# Which engine runs behind the proxy: vllm (GPU), vllm-cpu (a laptop), fastchat.",
        "COMPOSE_PROFILES=vllm-cpu",
        "# The model the engine serves; the proxy counts with its tokenizer (hf:MODEL).",
        "MODEL=Qwen/Qwen2.5-0.5B-Instruct",
        "# Where the model is cached: a named volume, or a host path such as",
        "# /home/you/.cache/huggingface (the engine writes it, the proxy mounts it read-only).",
        "HF_CACHE=hf-cache",
        "# Only for gated models: the engine downloads with it.",
        "HF_TOKEN=",
        "VLLM_IMAGE=vllm/vllm-openai:v0.32.0",
        "VLLM_CPU_IMAGE=vllm/vllm-openai-cpu:v0.32.0",
        "VLLM_MAX_MODEL_LEN=8192",
        "VLLM_CPU_KVCACHE_SPACE=4",
        "FASTCHAT_DEVICE=cpu",
        "PROXY_IMAGE=trimproxy:0.1.0",
        "# Where the published ports listen: loopback only, as /metrics has no key; set",
        "# 0.0.0.0 (with TRIMPROXY_API_KEYS) to serve other machines.",
        "BIND_ADDRESS=127.0.0.1",
        "PROXY_HOST_PORT=8080",
        "PROMETHEUS_HOST_PORT=9090",
        "GRAFANA_HOST_PORT=3000",
        "GRAFANA_ADMIN_PASSWORD=change-me",
        "# How long `docker compose stop` lets open streams finish before killing the proxy.",
        "STOP_GRACE_PERIOD=30s",
        "",
        "# --- the proxy (proxy/settings.py; `trimproxy serve --help` says the same) --------",
    ]
    for name, field in Settings.model_fields.items():
        variable = f"{ENV_PREFIX}{name.upper()}"
        lines.extend(
            textwrap.wrap(
                field.description or "", width=88, initial_indent="# ", subsequent_indent="# "
            )
        )
        if name in COMPOSE_SET:
            value, why = COMPOSE_SET[name]
            lines.append(f"# compose: {value} ({why}); the proxy's own default: {field.default}")
            lines.append(f"#{variable}={value}")
        elif field.default is None:
            lines.append(f"#{variable}=")
        else:
            lines.append(f"{variable}={_shown(field.default)}")
    return "\n".join(lines) + "\n"


def env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a dotenv file (comments and blanks skipped)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


GENERATED = {
    PROMETHEUS_RULE: prometheus_rule_text,
    DASHBOARD_CONFIGMAP: dashboard_configmap_text,
    ENV_EXAMPLE: env_example_text,
}


def main() -> int:
    for path, make in GENERATED.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


if __name__ == "__main__":
    raise SystemExit(main())
