"""The imports run one way: the module import graph of ``proxy/`` is acyclic, and every
test module is imported by its package name.

Built from the source with ``ast`` (nothing is imported), counting every import:
module level, inside functions (lazy imports) and under ``TYPE_CHECKING``. An edge
goes to the module named (``from proxy.a import b`` goes to ``proxy.a.b`` when that is
a module, else to ``proxy.a``); the implicit import of a parent package is not an
edge, so a package's ``__init__`` may re-export its own submodules.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "proxy"
TESTS = Path(__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The modules of ``proxy`` that one import statement names."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in modules)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1 if is_package else node.level)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            # ``from a import b``: the submodule a.b when there is one, else a itself.
            sub = f"{base}.{alias.name}"
            if sub in modules:
                yield sub
            elif base in modules:
                yield base


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    names = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text("utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            graph[name].update(t for t in _targets(node, name, is_package, names) if t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "proxy.app" in graph
    assert "proxy.settings" in graph["proxy.app"]


def test_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_proxy_imports_are_acyclic() -> None:
    cycle = find_cycle(import_graph())
    if cycle:
        pytest.fail("import cycle in proxy/: " + " -> ".join(cycle))


def missing_packages(root: Path) -> list[Path]:
    """Folders under ``root`` (``root`` too) that hold Python, or a folder that does, and
    have no ``__init__.py``.

    pytest's default import mode names a test module by its packages
    (``tests.admission.test_gate``); a folder that is not a package puts its modules in
    the top level, where two ``test_gate.py`` clash. mypy names them the same way.
    """
    holders = {path.parent for path in root.rglob("*.py") if "__pycache__" not in path.parts}
    needed = {root}
    for folder in holders:
        needed.update(p for p in [folder, *folder.parents] if p.is_relative_to(root))
    return sorted(folder for folder in needed if not (folder / "__init__.py").is_file())


def test_package_finder_finds_plain_folders(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").touch()
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "test_x.py").touch()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.json").touch()
    assert missing_packages(tmp_path) == [tmp_path / "a", tmp_path / "a" / "b"]
    (tmp_path / "a" / "__init__.py").touch()
    (tmp_path / "a" / "b" / "__init__.py").touch()
    assert missing_packages(tmp_path) == []


def test_every_test_folder_is_a_package() -> None:
    missing = [str(folder.relative_to(TESTS.parent)) for folder in missing_packages(TESTS)]
    assert not missing, f"add an __init__.py to: {', '.join(missing)}"


def test_test_modules_are_imported_by_package_name() -> None:
    # One import mode for all of tests/: the default, by package (not importlib).
    assert __name__ == "tests.test_imports"


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def node_of(module: str) -> str:
    """The top-level module or folder of ``proxy`` that ``module`` belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + ("/" if (PACKAGE / parts[1]).is_dir() else ".py")


def module_map(text: str) -> list[list[str]]:
    """The rows of the module map (docs/architecture.md §2), top layer first: the names
    each row's first cell gives."""
    section = text.split("## 2. Module map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            rows.append(re.findall(r"`([^`]+)`", first))
    return rows


def folder_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (node_of(a), node_of(b))
        for a, targets in graph.items()
        for b in targets
        if node_of(a) != node_of(b)
    }


def layer_breaches(rows: list[list[str]], edges: set[tuple[str, str]]) -> list[str]:
    """Each import that does not go to a row below its own."""
    layer = {name: i for i, row in enumerate(rows) for name in row}
    return sorted(f"{a} -> {b}" for a, b in edges if layer[a] >= layer[b])


def test_layer_check_finds_an_upward_import() -> None:
    rows = [["a.py"], ["b/", "c.py"]]
    assert layer_breaches(rows, {("a.py", "b/")}) == []
    assert layer_breaches(rows, {("b/", "a.py")}) == ["b/ -> a.py"]
    assert layer_breaches(rows, {("b/", "c.py")}) == ["b/ -> c.py"]


def test_the_module_map_names_every_module_and_folder() -> None:
    named = [name for row in module_map(ARCHITECTURE.read_text("utf-8")) for name in row]
    present = {node_of(m) for m in _modules()}
    assert sorted(present - set(named)) == [], "add these to docs/architecture.md §2"
    assert sorted(set(named) - present) == [], "docs/architecture.md §2 names what is gone"
    assert len(named) == len(set(named)), "a module named twice in the module map"


def test_imports_follow_the_module_map() -> None:
    rows = module_map(ARCHITECTURE.read_text("utf-8"))
    breaches = layer_breaches(rows, folder_edges(import_graph()))
    assert not breaches, "imports against the layer order of docs/architecture.md §2: " + (
        ", ".join(breaches)
    )


def folder_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle among the top-level modules and folders of ``proxy``, or None."""
    folders: dict[str, set[str]] = {node_of(m): set() for m in graph}
    for a, b in folder_edges(graph):
        folders[a].add(b)
    return find_cycle(folders)


def test_the_folders_import_one_way() -> None:
    cycle = folder_cycle(import_graph())
    assert cycle is None, "import loop between folders: " + " -> ".join(cycle or [])


#: What the request path stands on; none of it may lean on the request path.
BELOW_THE_PIPELINE = ("upstream/", "admission/", "sessions/", "tokens/", "dialects/", "engines/")


def test_the_request_path_stands_above_what_it_uses() -> None:
    edges = folder_edges(import_graph())
    leaning = sorted(
        f"{a} -> {b}" for a, b in edges if b == "pipeline/" and a in BELOW_THE_PIPELINE
    )
    assert not leaning, "a low room imports the request path: " + ", ".join(leaning)
    used = {b for a, b in edges if a == "pipeline/"}
    assert {"upstream/", "admission/", "sessions/", "tokens/", "dialects/"} <= used
    # The transport and KV admission share the disconnect and hop-by-hop rules from
    # below, not from the relay (docs/architecture.md §2).
    graph = import_graph()
    assert "proxy.hop" in graph["proxy.upstream.transport"]
    assert "proxy.hop" in graph["proxy.admission.gate"]
