"""proxy/dialects is a low layer: besides the standard library and orjson it imports
only proxy.types, proxy.errors, proxy.trimming, proxy.ladder (the pure trim ladder, over
trimming: a dialect's tool outputs are cleared with its placeholder), proxy.body,
proxy.choices (named values, importing nothing) and its own modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

DIALECTS = Path(__file__).resolve().parents[2] / "proxy" / "dialects"
ALLOWED = {
    "proxy.types",
    "proxy.errors",
    "proxy.trimming",
    "proxy.ladder",
    "proxy.body",
    "proxy.choices",
    "orjson",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(DIALECTS.glob("*.py")), ids=lambda p: p.name)
def test_dialects_import_only_the_low_layer(path: Path) -> None:
    for name in _imports(path):
        top = name.split(".")[0]
        ok = (
            name in ALLOWED
            or name.startswith("proxy.dialects")
            or (top in sys.stdlib_module_names and top != "proxy")
        )
        assert ok, f"{path.name} imports {name}"
