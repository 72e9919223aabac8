#!/usr/bin/env bash
# Build the vLLM venv (.cache/vllm-venv) and the tiny model ahead of the vLLM e2e
# tests, and print how long each took. Idempotent: a second run reuses both (the venv
# is keyed by tests/support/vllm-requirements.txt, the model by its shape and builder).
#
#   scripts/vllm_env.sh            # build (or reuse) venv + model
#   scripts/vllm_env.sh --serve    # ...then run an engine (6,144 KV tokens) until Ctrl-C
#
# PYTHON: the trimproxy venv's interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" - <<'PYEOF'
import time

from tests.support.vllm_stack import build_log, build_vllm_model, ensure_vllm_env

began = time.monotonic()
venv = ensure_vllm_env()
print(f"vllm venv: {venv} ({time.monotonic() - began:.1f}s; pip log {build_log()})")
began = time.monotonic()
model = build_vllm_model()
print(f"tiny model: {model} ({time.monotonic() - began:.1f}s)")
PYEOF
if [[ "${1:-}" == "--serve" ]]; then
    exec "$PY" -m tests.support.vllm_stack
fi
