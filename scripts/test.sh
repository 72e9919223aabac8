#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine and runs it:
# system services (redis-server, promtool) from Debian's packages when missing,
# the project's virtual environment, lint, type checks, then pytest. The real
# FastChat stack and the real vLLM engine build their own environments inside the
# test setup (tests/e2e); the vLLM one starts building in the background here.
#
#   bash scripts/test.sh [PYTEST ARGS]         the whole suite (what .ci/run runs): every
#       test but the real engines on four xdist workers, then the engines' tests in
#       order; with a -m of the caller's, one plain run
#   bash scripts/test.sh --fast [PYTEST ARGS]  the developer's loop: lint, types and
#       every test but the real engines and containers (-m "not vllm and not
#       fastchat and not container") on four pytest-xdist workers; no vLLM venv
#       build, and the project's venv is installed only when missing. Arguments
#       after --fast go to pytest (a later -m or -n wins).
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# trimproxy top is tested in a real terminal; DNS discovery against a real DNS server.
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
[ -x /usr/sbin/dnsmasq ] || command -v dnsmasq >/dev/null 2>&1 || missing+=(dnsmasq-base)
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
# The fast loop trusts a venv that has the test extras (xdist is the newest of them);
# after a change of dependencies, run the full script once, or pip install yourself.
if [ "$fast" = 0 ] || ! .venv/bin/python -c "import xdist" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test]'
fi

# The real vLLM engine (tests/e2e/test_vllm.py) needs its own venv, minutes to build:
# build it while lint, type checks and the other tests run. The tests' fixture waits
# for it (a file lock), rebuilds what is missing, and fails loudly if it cannot.
if [ "$fast" = 0 ] && [ "${TRIMPROXY_SKIP_VLLM:-}" != "1" ]; then
  mkdir -p .cache
  echo "== building the vLLM venv in the background (log: .cache/vllm-env.log)"
  PYTHON=.venv/bin/python bash scripts/vllm_env.sh >.cache/vllm-env.log 2>&1 &
fi

# The real Codex CLI (tests/compaction/test_codex.py) from npm, when npm is here; the
# test skips, saying why, when it is missing (offline, no npm).
if [ ! -x .cache/codex-npm/node_modules/.bin/codex ] && command -v npm >/dev/null 2>&1; then
  echo "== installing the Codex CLI into .cache/codex-npm"
  mkdir -p .cache/codex-npm
  npm install -q --prefix .cache/codex-npm @openai/codex >/dev/null 2>&1 \
    || echo "== the Codex CLI could not be installed; its test will skip" >&2
fi

echo "== ruff"
.venv/bin/ruff check proxy tests bench scripts
.venv/bin/ruff format --check proxy tests bench scripts
echo "== mypy (strict, proxy/ and tests/)"
.venv/bin/mypy
echo "== pytest"
# Bytecode is cached even where the environment says otherwise: every xdist worker and
# every `trimproxy serve` child the tests start would compile proxy/ and tests/ (and
# pytest rewrite the test modules' asserts) from source again, 4 s of CPU per worker.
unset PYTHONDONTWRITEBYTECODE
ENGINES="vllm or fastchat or container"
# The engines' fixtures resolved without starting anything (pytest --setup-plan), so a
# wrong fixture scope fails here in seconds, not at an engine test's setup half an hour in.
mkdir -p .cache
if ! .venv/bin/pytest --setup-plan -q -m "$ENGINES" tests >.cache/setup-plan.log 2>&1; then
  grep -E "ERROR|Error|Mismatch" .cache/setup-plan.log >&2 || tail -40 .cache/setup-plan.log >&2
  echo "== the engine tests' fixtures do not resolve (full plan: .cache/setup-plan.log)" >&2
  exit 1
fi
if [ "$fast" = 0 ]; then
  for arg in "$@"; do
    # A marker expression of the caller's own: one run, in order, as asked.
    case "$arg" in -m|-m*) exec .venv/bin/pytest "$@" ;; esac
  done
  # The whole suite in two runs: every test but the real engines on four xdist workers
  # (they wait on sockets and processes more than on the CPU), then the engines' tests
  # one at a time, as they share their engines (tests/e2e/conftest.py) and two at once
  # starve each other on two cores. The vLLM venv builds while the first run goes.
  rc=0 rc2=0
  .venv/bin/pytest -m "not ($ENGINES)" -n 4 --dist loadgroup "$@" || rc=$?
  .venv/bin/pytest -m "$ENGINES" "$@" || rc2=$?
  # Exit 5 is "nothing selected": a path given may hold only one kind of test.
  if [ "$rc" = 5 ] && [ "$rc2" = 5 ]; then exit 5; fi
  [ "$rc" = 5 ] && rc=0
  [ "$rc2" = 5 ] && rc2=0
  [ "$rc" != 0 ] && exit "$rc"
  exit "$rc2"
fi
rc=0
.venv/bin/pytest -m "not vllm and not fastchat and not container" -n 4 --dist loadgroup --hypothesis-profile fast "$@" || rc=$?
if [ "$rc" = 5 ]; then
  echo "== pytest selected no tests (exit 5): check the -k / -m / paths given after --fast" >&2
fi
exit "$rc"
