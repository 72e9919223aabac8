"""Every Kubernetes object of the kit against the API's own schemas, strictly (unknown
fields rejected), for two Kubernetes versions: what ``kubernetes-validate --strict -k V``
does, through its library. prometheus-operator's kinds are checked against their CRD
schemas, vendored in tests/deploy/schemas (README there)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.kit import KUBE, KUBE_VERSIONS, ROOT, kube_objects, manifest_files

SCHEMAS = Path(__file__).resolve().parent / "schemas"
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.v1.json",
}
OBJECTS = [
    pytest.param(
        obj, id=f"{path.relative_to(ROOT / 'deploy')}:{obj['kind']}/{obj['metadata']['name']}"
    )
    for path, obj in kube_objects()
]


def _strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (what the
    API server's strict field validation does with a structural CRD schema)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def crd_validator(name: str) -> jsonschema.Draft7Validator:
    schema = _strict(json.loads((SCHEMAS / name).read_text()))
    # apiVersion, kind and metadata are the API server's, not the CRD's, to check.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("obj", OBJECTS)
def test_object_validates_strictly(obj: dict[str, Any], version: str) -> None:
    crd = CRD_KINDS.get((obj["apiVersion"], obj["kind"]))
    if crd is None:
        kubernetes_validate.validate(obj, version, strict=True)
        return
    errors = [f"{list(e.path)}: {e.message}" for e in crd_validator(crd).iter_errors(obj)]
    assert not errors, errors
    # The object's metadata, checked as the ObjectMeta it is.
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(obj["metadata"])}
    kubernetes_validate.validate(holder, version, strict=True)


def test_a_misspelt_field_is_caught() -> None:
    (obj,) = [o for _, o in kube_objects() if o["kind"] == "PodDisruptionBudget"]
    bad = copy.deepcopy(obj)
    bad["spec"]["maxUnavailabel"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[0], strict=True)
    (monitor,) = [o for _, o in kube_objects() if o["kind"] == "ServiceMonitor"]
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["intervall"] = "15s"
    assert list(crd_validator("servicemonitor.v1.json").iter_errors(bad))


def test_the_command_line_agrees() -> None:
    """The ``kubernetes-validate --strict`` command, as an operator runs it, on the
    built-in kinds (it has no schema for prometheus-operator's)."""
    files = [str(p) for p in manifest_files() if p.parent.name != "monitoring"]
    files.append(str(KUBE / "monitoring" / "grafana-dashboard.yaml"))
    command = Path(sys.executable).parent / "kubernetes-validate"
    for version in KUBE_VERSIONS:
        done = subprocess.run(
            [str(command), "--strict", "--quiet", "-k", version, *files],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
