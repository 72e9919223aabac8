#!/usr/bin/env bash
# Build the FastChat venv (.cache/fastchat-venv) and the tiny model ahead of the
# FastChat e2e tests, and print how long each took. Idempotent: a second run reuses
# both (the venv is keyed by its pins, the model by its builder's source).
#
#   scripts/fastchat_env.sh            # build (or reuse) venv + model
#   scripts/fastchat_env.sh --serve    # ...then run a stack until Ctrl-C
#
# PYTHON: the trimproxy venv's interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" - <<'PYEOF'
import tempfile
import time
from pathlib import Path

from tests.support.fastchat_stack import ensure_fastchat_env
from tests.support.tiny_model import build_model

began = time.monotonic()
venv = ensure_fastchat_env()
print(f"fastchat venv: {venv} ({time.monotonic() - began:.1f}s)")
began = time.monotonic()
with tempfile.TemporaryDirectory() as tmp:
    build_model(Path(tmp) / "tiny-chat", python=venv / "bin" / "python")
print(f"tiny model: ({time.monotonic() - began:.1f}s)")
PYEOF
if [[ "${1:-}" == "--serve" ]]; then
    exec "$PY" -m tests.support.fastchat_stack
fi
