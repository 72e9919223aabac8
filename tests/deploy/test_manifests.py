"""The Kubernetes manifests agree with the code they deploy and with each other.

No cluster runs here, so these check what would only show after ``kubectl apply``:
settings that do not exist or do not validate, probes on routes that are not there,
selectors that select nothing, a drain shorter than a stream, a tokenizer volume that
cannot hold a tokenizer, an open proxy when the key Secret is missing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from proxy.settings import Settings
from tests.deploy.kit import (
    DOCKERFILE,
    GENERATED,
    KUBE,
    REGENERATE,
    ROOT,
    kube_object,
    kube_objects,
    validate_settings,
)

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = kube_object("Deployment", name)["spec"]["template"]["spec"]
    return spec


def proxy_container() -> dict[str, Any]:
    (container,) = pod_spec("trimproxy")["containers"]
    assert isinstance(container, dict)
    return container


def proxy_settings() -> Settings:
    values = dict(kube_object("ConfigMap", "trimproxy")["data"])
    for entry in proxy_container().get("env", []):
        values[entry["name"]] = entry.get("value", "secret-value")
    return validate_settings(values, "deploy/kubernetes")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def proxy_pod_labels() -> dict[str, str]:
    labels: dict[str, str] = kube_object("Deployment", "trimproxy")["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def test_every_trimproxy_setting_exists_and_validates() -> None:
    settings = proxy_settings()
    assert settings.redis_url and settings.session_max_turns
    assert settings.tokenizer.startswith("hf:")
    # Every TRIMPROXY_* written anywhere in a manifest is a setting (comments included:
    # an operator copies them).
    for path in KUBE.rglob("*.yaml"):
        for name in re.findall(r"\bTRIMPROXY_[A-Z0-9_]+\b", path.read_text()):
            assert name[len("TRIMPROXY_") :].lower() in Settings.model_fields, (path, name)


def test_the_api_key_secret_is_required() -> None:
    env = {e["name"]: e for e in proxy_container()["env"]}
    ref = env["TRIMPROXY_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "trimproxy" and not ref.get("optional", False)
    # The kit ships no Secret with a guessable key in it.
    assert not [o for _, o in kube_objects() if o["kind"] == "Secret"]


def test_the_tokenizer_comes_from_the_hf_cache_volume_never_a_configmap() -> None:
    spec = pod_spec("trimproxy")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert not any("configMap" in v for v in volumes.values())
    (mount,) = [m for m in proxy_container()["volumeMounts"] if m["name"] == "hf-cache"]
    assert mount["readOnly"] is True
    claim = volumes["hf-cache"]["persistentVolumeClaim"]
    assert claim["claimName"] and claim["readOnly"] is True
    # The image reads the model cache where the volume is mounted.
    assert f"HF_HUB_CACHE={mount['mountPath']}/hub" in DOCKERFILE.read_text()


def test_every_container_is_locked_down_and_sized() -> None:
    seen = 0
    for path, obj in kube_objects():
        if obj["kind"] not in WORKLOADS:
            continue
        spec = obj["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, path
        assert spec.get("automountServiceAccountToken") is False, path
        # Service links would put <SERVICE>_PORT=tcp://... into the environment, and a
        # Service called trimproxy makes that TRIMPROXY_PORT.
        assert spec.get("enableServiceLinks") is False, path
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, (path, container["name"])
            assert ctx["readOnlyRootFilesystem"] is True, (path, container["name"])
            assert ctx["capabilities"]["drop"] == ["ALL"], (path, container["name"])
            assert not ctx.get("privileged", False)
            resources = container["resources"]
            assert resources["requests"]["cpu"] and resources["requests"]["memory"]
            assert resources["limits"]["memory"], (path, container["name"])
            assert ":latest" not in container["image"], (path, container["image"])
            seen += 1
    assert seen >= 2


def test_redis_is_pinned_by_digest_with_limits() -> None:
    (redis,) = pod_spec("trimproxy-redis")["containers"]
    assert re.fullmatch(r"redis:[0-9.]+-alpine@sha256:[0-9a-f]{64}", redis["image"])
    assert redis["resources"]["limits"]["cpu"] and redis["resources"]["limits"]["memory"]
    assert "--maxmemory" in redis["args"]


def _sleep_seconds(container: dict[str, Any]) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def test_long_streams_finish_before_the_pod_is_killed() -> None:
    settings = proxy_settings()
    grace = pod_spec("trimproxy")["terminationGracePeriodSeconds"]
    drain = settings.graceful_shutdown_timeout
    assert drain is not None, "set TRIMPROXY_GRACEFUL_SHUTDOWN_TIMEOUT below the grace period"
    # A stream may stall up to the read timeout between two chunks: give it at least that.
    assert drain >= settings.read_timeout
    # preStop runs first, inside the grace period; leave room for the lifespan shutdown.
    assert _sleep_seconds(proxy_container()) + drain + 10 <= grace


def test_probes_hit_real_routes_and_outwait_readyz() -> None:
    from proxy.routes import routes

    paths = {route.path for route in routes()}
    container = proxy_container()
    settings = proxy_settings()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in paths, probe
        assert container[probe]["httpGet"]["port"] == "http"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # /readyz waits at most TRIMPROXY_READY_TIMEOUT for the upstream; a probe that gives
    # up first would mark a healthy pod unready.
    assert container["readinessProbe"]["timeoutSeconds"] > settings.ready_timeout
    assert settings.ready_requires_upstream is False


def test_ports_line_up_with_the_image() -> None:
    (port,) = proxy_container()["ports"]
    dockerfile = DOCKERFILE.read_text()
    assert f"TRIMPROXY_PORT={port['containerPort']}" in dockerfile
    assert f"EXPOSE {port['containerPort']}" in dockerfile
    service = kube_object("Service", "trimproxy")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]


def test_selectors_select_the_pods_they_mean() -> None:
    pods = proxy_pod_labels()
    deployment = kube_object("Deployment", "trimproxy")
    assert selects(deployment["spec"]["selector"]["matchLabels"], pods)
    assert selects(kube_object("Service", "trimproxy")["spec"]["selector"], pods)
    assert selects(kube_object("PodDisruptionBudget", "trimproxy")["spec"]["selector"][
        "matchLabels"], pods)  # fmt: skip
    assert selects(kube_object("NetworkPolicy", "trimproxy")["spec"]["podSelector"][
        "matchLabels"], pods)  # fmt: skip
    target = kube_object("HorizontalPodAutoscaler", "trimproxy")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "trimproxy")
    # The PDB and the HPA agree: the HPA never goes below what the PDB lets drain.
    hpa = kube_object("HorizontalPodAutoscaler", "trimproxy")["spec"]
    assert hpa["minReplicas"] >= 2 and deployment["spec"]["replicas"] >= 2
    service = kube_object("Service", "trimproxy")
    monitor = kube_object("ServiceMonitor", "trimproxy")["spec"]
    assert selects(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= port_names
    redis = kube_object("Deployment", "trimproxy-redis")["spec"]["template"]["metadata"]
    assert selects(kube_object("Service", "trimproxy-redis")["spec"]["selector"], redis["labels"])
    allowed = kube_object("NetworkPolicy", "trimproxy-redis")["spec"]["ingress"][0]["from"]
    assert any(selects(peer["podSelector"]["matchLabels"], pods) for peer in allowed)


def test_the_ingress_carries_sse_and_keeps_metrics_inside() -> None:
    ingress = kube_object("Ingress", "trimproxy")
    notes = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert notes[prefix + "proxy-buffering"] == "off"
    assert notes[prefix + "proxy-request-buffering"] == "off"
    read_timeout = proxy_settings().read_timeout
    assert int(notes[prefix + "proxy-read-timeout"]) > read_timeout
    assert int(notes[prefix + "proxy-send-timeout"]) > read_timeout
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert [p["path"] for p in paths] == ["/v1"]
    for p in paths:
        assert p["backend"]["service"]["name"] == "trimproxy"
    # nginx must not answer 413 before the proxy can (with an OpenAI envelope).
    limit = int(notes[prefix + "proxy-body-size"].removesuffix("m")) * 1024 * 1024
    assert limit > proxy_settings().max_body_bytes


def test_the_dashboard_configmap_is_labelled_for_grafanas_sidecar() -> None:
    configmap = kube_object("ConfigMap", "trimproxy-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_generated_files_are_up_to_date(path: Path) -> None:
    assert path.read_text() == GENERATED[path](), (
        f"{path.relative_to(ROOT)} is stale: run `{REGENERATE}`"
    )


def test_the_engines_service_is_headless() -> None:
    # One DNS record per ready vLLM pod, for dns+http:// discovery of the engines; a
    # cluster IP would balance every turn over the engines and split their prefix caches.
    service = kube_object("Service", "vllm-headless")["spec"]
    assert service["clusterIP"] == "None"
    assert service["publishNotReadyAddresses"] is False
    assert service["selector"]
    (port,) = service["ports"]
    assert (port["name"], port["port"], port["protocol"]) == ("http", 8000, "TCP")
