"""docker/Dockerfile's image, built for real: its environment is consistent, it runs as
10001:10001 with both ids named, and it serves locked down (read-only root, every
capability dropped, no new privileges, a tmpfs /tmp) with its HEALTHCHECK passing."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.deploy.containers.engine import Engine

pytestmark = pytest.mark.container

LOCKED_DOWN = (
    "--read-only",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--tmpfs",
    "/tmp",
)


def test_the_image_config_keeps_the_user_and_the_healthcheck(
    engine: Engine, images: dict[str, str]
) -> None:
    found = engine.inspect(images["proxy"], kind="image")
    config = found["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["trimproxy"] and config["Cmd"] == ["serve"]
    # An OCI-format build (podman's default) silently drops the HEALTHCHECK. docker
    # shows it in Config, podman beside it.
    healthcheck = config.get("Healthcheck") or found.get("Healthcheck")
    assert healthcheck, "no HEALTHCHECK in the image: build with --format docker"
    test = healthcheck["Test"]
    assert test[0] == "CMD" and "/healthz" in test[-1], test


def test_pip_check_is_clean_and_no_torch(engine: Engine, images: dict[str, str]) -> None:
    out = engine("run", "--rm", "--entrypoint", "pip", images["proxy"], "check")
    assert "No broken requirements found." in out
    listed = engine("run", "--rm", "--entrypoint", "pip", images["proxy"], "list")
    assert not re.search(r"^(torch|triton|nvidia-)", listed, flags=re.MULTILINE | re.I)
    assert re.search(r"^trimproxy\s+0\.1\.0$", listed, flags=re.MULTILINE), listed


def test_the_build_secret_stays_out_of_the_image(engine: Engine, images: dict[str, str]) -> None:
    """``--host-ca`` passes the host's CA bundle as the build secret ``host-ca``, mounted
    over the base's for the pip step alone: the image keeps the base's bundle."""
    bundle = "/etc/ssl/certs/ca-certificates.crt"

    def digest(image: str) -> str:
        return engine("run", "--rm", "--entrypoint", "sha256sum", image, bundle).split()[0]

    assert digest(images["proxy"]) == digest(images["python"])


def test_it_runs_as_10001_with_that_group_named(engine: Engine, images: dict[str, str]) -> None:
    out = engine("run", "--rm", "--entrypoint", "id", images["proxy"]).strip()
    assert out == "uid=10001(trimproxy) gid=10001(trimproxy) groups=10001(trimproxy)"


@pytest.fixture
def demo(engine: Engine, images: dict[str, str]) -> Iterator[str]:
    """``serve --demo`` locked down, its port published on the loopback."""
    name = f"trimproxy-ct-demo-{os.getpid()}"
    engine(
        "run",
        "-d",
        "--name",
        name,
        *LOCKED_DOWN,
        "-p",
        "127.0.0.1::8080",
        images["proxy"],
        "serve",
        "--demo",
    )
    try:
        yield name
    finally:
        engine("rm", "-f", name, check=False)


def test_it_serves_locked_down_and_its_healthcheck_passes(engine: Engine, demo: str) -> None:
    engine.wait_healthy(demo)
    port = engine.host_port(demo, 8080)
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    # What the process really got: no capability, no way to gain one, a read-only root,
    # a writable /tmp.
    status = engine("exec", demo, "cat", "/proc/1/status")
    fields = dict(re.findall(r"^(\w+):\s+(.*)$", status, flags=re.MULTILINE))
    for kind in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[kind], 16) == 0, (kind, fields[kind])
    assert fields["NoNewPrivs"] == "1"
    assert fields["Uid"].split()[0] == "10001" and fields["Gid"].split()[0] == "10001"
    done = engine("exec", demo, "sh", "-c", "touch /app/x 2>&1 || echo refused")
    assert "Read-only file system" in done and "refused" in done
    engine("exec", demo, "touch", "/tmp/x")


def test_every_compiled_dependency_loads(engine: Engine, images: dict[str, str]) -> None:
    """pip check cannot see a missing system library: numpy (under transformers) needs
    libstdc++, which a base without apt lacks. Import each package with compiled code."""
    modules = "numpy, tokenizers, tiktoken, orjson, uvloop, httptools, pydantic_core, yarl"
    code = f"import {modules}, transformers; print('loaded')"
    out = engine("run", "--rm", "--entrypoint", "python", images["proxy"], "-c", code)
    assert out.strip() == "loaded"
