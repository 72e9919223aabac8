#!/usr/bin/env bash
# Rehearse docker/Dockerfile's build without a container engine: the same pip commands
# on this machine's Python 3.11, into a scratch directory, then the image's entry point
# and HEALTHCHECK against `trimproxy serve --demo`. It proves the lock installs (every
# hash matches, every package has a wheel), that nothing needs a compiler, that the
# installed set satisfies trimproxy's own requirements with no torch, and that the
# health check command works. What it cannot show: the base image itself.
#   bash docker/rehearse-build.sh        (about two minutes; needs the package index)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
work=$(mktemp -d -t trimproxy-image-XXXXXX)
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv" && "$PY" -m venv "$work/build"
pip_flags=(--quiet --disable-pip-version-check --require-hashes --only-binary=:all: --no-deps)
"$work/venv/bin/pip" install "${pip_flags[@]}" -r docker/requirements.lock
"$work/build/bin/pip" install "${pip_flags[@]}" -r docker/build-requirements.lock
mkdir "$work/src" && cp pyproject.toml README.md "$work/src/" && cp -r proxy "$work/src/proxy"
(cd "$work/src" && "$work/build/bin/pip" wheel --quiet --no-deps --no-build-isolation \
    --wheel-dir "$work/wheels" .)
"$work/venv/bin/pip" install --quiet --no-deps "$work"/wheels/*.whl
"$work/venv/bin/pip" check
if "$work/venv/bin/pip" list 2>/dev/null | grep -iE '^(torch|nvidia-|triton)'; then
  echo "FAIL: a torch or CUDA package is in the image's environment" >&2; exit 1
fi
port=18$((RANDOM % 900 + 100))
mkdir "$work/app" && cd "$work/app"
env -i PATH="$work/venv/bin:/usr/bin:/bin" HF_HUB_OFFLINE=1 HF_HOME="$work/hf-home" \
    TRIMPROXY_HOST=127.0.0.1 TRIMPROXY_PORT="$port" trimproxy serve --demo >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 120); do
  if env TRIMPROXY_PORT="$port" "$work/venv/bin/python" -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TRIMPROXY_PORT', '8080'), timeout=2)" 2>/dev/null; then
    echo "ok: the locked environment installs and serves; HEALTHCHECK passes"; exit 0
  fi
  sleep 1
done
cat "$work/serve.log" >&2; echo "FAIL: the proxy did not answer /healthz" >&2; exit 1
