"""docs/models.md's key table names every key a models file table may set
(``proxy.models.MODEL_KEYS``, what the parser accepts), and nothing else."""

from __future__ import annotations

import re

from proxy.models import MODEL_KEYS
from tests.support.processes import REPO_ROOT


def table_keys() -> set[str]:
    text = (REPO_ROOT / "docs" / "models.md").read_text("utf-8")
    lines = text.splitlines()
    start = lines.index("| key | falls back to | what it decides |")
    keys: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        keys.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return keys


def test_the_key_table_lists_every_key_the_parser_accepts() -> None:
    keys = table_keys()
    assert MODEL_KEYS - keys == set(), "keys a models file takes, missing from docs/models.md"
    assert keys - MODEL_KEYS == set(), "keys in docs/models.md that a models file refuses"
