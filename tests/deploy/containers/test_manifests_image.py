"""The Kubernetes manifests and the compose file against the image as it was built (its
real config, not the Dockerfile's text): the image name and tag they run is the one
built, the user they run as is the image's, the port is the one it listens on, and every
path the image reads or writes is mounted, read-only or writable as it needs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.containers.engine import Engine
from tests.deploy.kit import COMPOSE, kube_object

pytestmark = pytest.mark.container


def image_env(engine: Engine, image: str) -> dict[str, str]:
    config = engine.inspect(image, kind="image")["Config"]
    return dict(entry.split("=", 1) for entry in config["Env"])


def covering(mounts: dict[str, bool], path: str) -> bool | None:
    """Whether the mount holding ``path`` is read-only (None: no mount holds it)."""
    best = max((m for m in mounts if path == m or path.startswith(m + "/")), key=len, default=None)
    return None if best is None else mounts[best]


def test_the_deployment_runs_the_built_image_as_it_expects(
    engine: Engine, images: dict[str, str]
) -> None:
    pod = kube_object("Deployment", "trimproxy")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == images["proxy"]
    config = engine.inspect(images["proxy"], kind="image")["Config"]
    user, group = config["User"].split(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(user),
        int(group),
    )
    env = image_env(engine, images["proxy"])
    (port,) = container["ports"]
    assert f"{port['containerPort']}/tcp" in config["ExposedPorts"]
    assert env["TRIMPROXY_PORT"] == str(port["containerPort"])
    mounts = {m["mountPath"]: bool(m.get("readOnly")) for m in container["volumeMounts"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The model cache is read (read-only is enough); HF_HOME and the metrics directory
    # of several workers (tempfile, so TMPDIR or /tmp) are written.
    assert covering(mounts, env["HF_HUB_CACHE"]) is True
    assert covering(mounts, env["HF_HOME"]) is False
    assert covering(mounts, env.get("TMPDIR", "/tmp")) is False


def _compose_mounts(service: dict[str, Any]) -> dict[str, bool]:
    mounts = {}
    for volume in service.get("volumes", []):
        # SOURCE:TARGET[:ro], where SOURCE may be ${VARIABLE:-default}.
        target = volume.rsplit("}", 1)[-1].split(":")[1]
        mounts[target] = volume.endswith(":ro")
    mounts.update({path: False for path in service.get("tmpfs", [])})
    return mounts


def test_compose_runs_the_built_image_as_it_expects(engine: Engine, images: dict[str, str]) -> None:
    proxy = yaml.safe_load(COMPOSE.read_text())["services"]["trimproxy"]
    assert proxy["image"] == "${PROXY_IMAGE:-" + images["proxy"] + "}"
    config = engine.inspect(images["proxy"], kind="image")["Config"]
    assert proxy["user"] == config["User"]
    env = image_env(engine, images["proxy"])
    mounts = _compose_mounts(proxy)
    assert proxy["read_only"] is True
    assert covering(mounts, env["HF_HUB_CACHE"]) is True
    assert covering(mounts, env["HF_HOME"]) is False
    assert proxy["ports"][0].endswith(":" + env["TRIMPROXY_PORT"])
