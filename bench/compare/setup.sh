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
# (langchain-core 1.8.4 needs a langchain-protocol release the registry lacks.)
"$venv/bin/python" -m pip install --quiet "litellm==${LITELLM_VERSION:-1.110.2}" \
  "langchain-core==${LANGCHAIN_CORE_VERSION:-1.8.3}"

# The shared token counter is tiktoken's cl100k_base, and this machine may have no
# route to where tiktoken downloads it from. LiteLLM ships a copy (it counts with
# it by default); put it where tiktoken's cache looks, under tiktoken's own file
# name for it (the SHA-1 of its download address). tiktoken checks the file's
# SHA-256 when it loads it, so a wrong file fails here, not in the bench.
"$venv/bin/python" - "$root/.cache/tiktoken" <<'PY'
import importlib.util
import os
import shutil
import sys
from pathlib import Path

dest = Path(sys.argv[1])
key = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
target = dest / key
if not target.exists():
    # find_spec, not import: importing LiteLLM tries the network for its price list.
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    bundled = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers" / key
    if not bundled.exists():
        sys.exit(f"no cl100k_base file to seed {target} from: copy cl100k_base.tiktoken there")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundled, target)
os.environ["TIKTOKEN_CACHE_DIR"] = str(dest)
import tiktoken

print("cl100k_base loads offline:", tiktoken.get_encoding("cl100k_base").n_vocab, "tokens")
PY

"$venv/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("trimproxy", "litellm", "langchain-core", "tiktoken"):
    print(f"{name:15} {version(name)}")
PY
echo "compare venv ready: $venv"
