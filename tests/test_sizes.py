"""The size limits of ``proxy/`` (CONTRIBUTING.md, the house style): no module over 450
lines, no class over 250, no function over 60.

Read from the source with ``ast``. The exceptions are named here, each for what it is:
the declaration lists (every metric in ``Metrics``, every setting in ``Settings``, every
dialect's row in ``builtin_dialects``), which read best whole; the one send every
request makes, kept inline; and the simulator (``proxy/sim``), a tool beside the
server. A new exception is a decision made here, in review, not one a merge makes by
accident.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "proxy"

MODULE_LINES = 450
CLASS_LINES = 250
FUNCTION_LINES = 60

#: Not measured at all: the simulated upstream.
SKIPPED = ("proxy/sim/",)
#: The declaration lists, by ``path`` or ``path::qualified name``.
ALLOWED = frozenset(
    {
        "proxy/metrics.py",  # every metric of the proxy, declared once
        "proxy/metrics.py::Metrics",
        "proxy/metrics.py::Metrics.__init__",
        "proxy/settings.py",  # every TRIMPROXY_* setting, declared once
        "proxy/settings.py::Settings",
        "proxy/pipeline/table.py::builtin_dialects",  # every dialect's row, declared once
        # The send every request makes, inline (aiohttp's request included): a Python
        # frame less on each one (docs/performance.md §6), not split for a line count.
        "proxy/upstream/transport.py::Transport.send",
    }
)


def _defs(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every class and function under ``tree``, with its qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node
            yield from _defs(node, name + ".")
        else:
            yield from _defs(node, prefix)


def oversized(path: str, source: str) -> list[tuple[str, int, int]]:
    """``(what, lines, limit)`` for each part of one module over its limit."""
    found = []
    lines = len(source.splitlines())
    if lines > MODULE_LINES:
        found.append((path, lines, MODULE_LINES))
    for name, node in _defs(ast.parse(source, path)):
        assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        assert node.end_lineno is not None
        length = node.end_lineno - node.lineno + 1
        limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
        if length > limit:
            found.append((f"{path}::{name}", length, limit))
    return found


def _measured() -> list[tuple[str, int, int]]:
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        if not path.startswith(SKIPPED):
            found.extend(oversized(path, file.read_text("utf-8")))
    return found


def test_the_checker_finds_each_kind_of_oversize() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    source = f"class A:\n    def long(self) -> None:\n{body}\n"
    assert [what for what, _, _ in oversized("m.py", source)] == ["m.py::A.long"]
    methods = "\n".join(f"    def f{i}(self) -> None:\n        pass" for i in range(130))
    assert [what for what, _, _ in oversized("m.py", f"class B:\n{methods}\n")] == ["m.py::B"]
    lines = "\n".join(f"x{i} = {i}" for i in range(MODULE_LINES + 1))
    assert oversized("m.py", lines) == [("m.py", MODULE_LINES + 1, MODULE_LINES)]
    assert oversized("m.py", "def f() -> None:\n    pass\n") == []


def test_no_module_class_or_function_of_proxy_is_over_its_limit() -> None:
    breaches = [
        f"{what}: {n} lines (> {limit})" for what, n, limit in _measured() if what not in ALLOWED
    ]
    assert not breaches, "split these (CONTRIBUTING.md): " + "; ".join(breaches)


def test_every_exception_is_still_needed() -> None:
    over = {what for what, _, _ in _measured()}
    assert sorted(ALLOWED - over) == [], "within its limit now: take it out of ALLOWED"
