#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine and runs it:
# system services (redis-server, promtool) from Debian's packages when missing,
# the project's virtual environment, lint, type checks, then pytest. The real
# FastChat stack and the real vLLM engine build their own environments inside the
# test setup (tests/e2e); the vLLM one starts building in the background here.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

# The real vLLM engine (tests/e2e/test_vllm.py) needs its own venv, minutes to build:
# build it while lint, type checks and the other tests run. The tests' fixture waits
# for it (a file lock), rebuilds what is missing, and fails loudly if it cannot.
if [ "${TRIMPROXY_SKIP_VLLM:-}" != "1" ]; then
  mkdir -p .cache
  echo "== building the vLLM venv in the background (log: .cache/vllm-env.log)"
  PYTHON=.venv/bin/python bash scripts/vllm_env.sh >.cache/vllm-env.log 2>&1 &
fi

echo "== ruff"
.venv/bin/ruff check proxy tests bench scripts
.venv/bin/ruff format --check proxy tests bench scripts
echo "== mypy (strict, proxy/ and tests/)"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
