#!/usr/bin/env bash
# Builds the side-by-side venv for bench/compare: trimproxy (editable) plus the peer
# trimmers, LiteLLM and LangChain. They live in their own venv on purpose, so the
# proxy's own environment never depends on them.
#
#   bash bench/compare/setup.sh            # creates .cache/compare-venv
#   COMPARE_VENV=/elsewhere bash bench/compare/setup.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${COMPARE_VENV:-$root/.cache/compare-venv}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# Editable, so the bench measures the working tree's trimming, not a stale copy.
"$venv/bin/python" -m pip install --quiet -e "$root"
# Versions are pinned so that reruns compare the same peers; bump them on purpose.
"$venv/bin/python" -m pip install --quiet "litellm==${LITELLM_VERSION:-1.110.2}" \
  "langchain-core==${LANGCHAIN_CORE_VERSION:-1.8.3}"

"$venv/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("trimproxy", "litellm", "langchain-core", "tiktoken"):
    print(f"{name:15} {version(name)}")
PY
echo "compare venv ready: $venv"
