"""deploy/compose started for real with compose.ci.yaml: the files it needs (an env file,
a Hugging Face cache holding the tiny test model's tokenizer), ``up``, the published
ports of each replica and of Prometheus once all are healthy, and ``down``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.deploy.containers.engine import Compose, Engine, EngineError
from tests.deploy.kit import COMPOSE, COMPOSE_DIR
from tests.support.tiny_model import build_tokenizer

CI_COMPOSE = COMPOSE_DIR / "compose.ci.yaml"
#: The model the sim serves and the proxy counts for (hf:MODEL, compose.yaml's default).
MODEL = "trimproxy-ci/tiny-chat"
REVISION = "0" * 40
REPLICAS = 2


def hf_cache(root: Path) -> Path:
    """A Hugging Face hub cache (the layout ``huggingface_hub`` writes) holding MODEL's
    tokenizer, readable by the image's user: what the engine leaves in the shared cache."""
    repo = root / "hub" / ("models--" + MODEL.replace("/", "--"))
    build_tokenizer(repo / "snapshots" / REVISION)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def env_file(path: Path, cache: Path, images: dict[str, str]) -> Path:
    values = {
        "COMPOSE_PROFILES": "",
        "MODEL": MODEL,
        "HF_CACHE": str(cache),
        "PROXY_IMAGE": images["proxy"],
        "CI_REDIS_IMAGE": images["redis"],
        "CI_PROMETHEUS_IMAGE": images["prometheus"],
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


@dataclass(frozen=True)
class Stack:
    engine: Engine
    compose: Compose
    proxies: tuple[str, ...]  # container names, replica order
    proxy_urls: tuple[str, ...]
    prometheus_url: str


def _wait_ready(url: str, attempts: int = 60) -> None:
    for _ in range(attempts):
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise EngineError(f"{url} never answered 200")


def project(command: tuple[str, ...], images: dict[str, str], tmp: Path) -> Compose:
    """The CI stack's compose project, its files written under ``tmp``."""
    return Compose(
        command=command,
        files=(COMPOSE, CI_COMPOSE),
        env_file=env_file(tmp / "ci.env", hf_cache(tmp / "hf"), images),
        project=f"trimproxy-ct-{os.getpid()}",
    )


def start(engine: Engine, compose: Compose) -> Stack:
    """``up``, then wait until every service is healthy (podman-compose before podman
    4.6 does not wait for ``service_healthy`` itself)."""
    compose("up", "-d", "trimproxy", "prometheus")
    for service in ("redis", "sim"):
        (container,) = engine.containers(compose.project, service)
        engine.wait_healthy(container)
    proxies = tuple(engine.containers(compose.project, "trimproxy"))
    assert len(proxies) == REPLICAS, proxies
    for container in proxies:
        engine.wait_healthy(container)
    (prometheus,) = engine.containers(compose.project, "prometheus")
    prometheus_url = f"http://127.0.0.1:{engine.host_port(prometheus, 9090)}"
    _wait_ready(prometheus_url + "/-/ready")
    return Stack(
        engine=engine,
        compose=compose,
        proxies=proxies,
        proxy_urls=tuple(f"http://127.0.0.1:{engine.host_port(c, 8080)}" for c in proxies),
        prometheus_url=prometheus_url,
    )
