"""Code comments cite what a clone of the repository holds: ``docs/architecture.md``
sections that exist, never an issue tracker's numbers or a design file kept elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.processes import REPO_ROOT

CODE_DIRS = ("proxy", "tests", "bench", "scripts", "deploy", "docker")
CODE_SUFFIXES = {".py", ".sh", ".lua", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt"}
# Built from parts so that this file does not cite what it forbids.
FORBIDDEN = (
    re.compile(r"\b" + "DES" + r"IGN\b"),
    re.compile(r"\b" + "iss" + r"ues?\s+#?\d+", re.IGNORECASE),
)
CITATION = re.compile(r"docs/architecture\.md\s+((?:§\s*\d+(?:,\s*)?)+)")
SECTION = re.compile(r"^## (\d+)\. ", re.MULTILINE)


def code_files() -> list[Path]:
    files: list[Path] = []
    for top in CODE_DIRS:
        for path in sorted((REPO_ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix in CODE_SUFFIXES or path.name.startswith("Dockerfile"):
                files.append(path)
    return files


def forbidden_citations(text: str) -> list[str]:
    return [m.group(0) for pattern in FORBIDDEN for m in pattern.finditer(text)]


def cited_sections(text: str) -> set[int]:
    return {int(n) for m in CITATION.finditer(text) for n in re.findall(r"\d+", m.group(1))}


def architecture_sections() -> list[int]:
    text = (REPO_ROOT / "docs" / "architecture.md").read_text("utf-8")
    return [int(n) for n in SECTION.findall(text)]


def test_the_patterns_catch_what_they_are_for() -> None:
    design, issue, issues = "DES" + "IGN", "iss" + "ue 17", "Iss" + "ues #4"
    sample = f"see {design} section 3 and ({issue}), {issues}"
    assert forbidden_citations(sample) == [design, issue, issues]
    assert forbidden_citations("by design, as designed; an issue with 3 parts") == []
    assert cited_sections("docs/architecture.md §6, and docs/architecture.md §10, §18") == {
        6,
        10,
        18,
    }


def test_there_are_code_files_to_check() -> None:
    names = {p.relative_to(REPO_ROOT).as_posix() for p in code_files()}
    assert {"proxy/trimming.py", "scripts/test.sh", "deploy/kubernetes/deployment.yaml"} <= names


def test_no_comment_cites_an_issue_number_or_the_design_file() -> None:
    found = {
        path.relative_to(REPO_ROOT).as_posix(): hits
        for path in code_files()
        if (hits := forbidden_citations(path.read_text("utf-8", errors="replace")))
    }
    assert found == {}


def test_architecture_sections_are_numbered_in_order() -> None:
    sections = architecture_sections()
    assert sections == list(range(1, len(sections) + 1)), sections


def test_every_cited_section_exists() -> None:
    sections = set(architecture_sections())
    cited: dict[int, list[str]] = {}
    for path in code_files():
        for n in cited_sections(path.read_text("utf-8", errors="replace")):
            cited.setdefault(n, []).append(path.relative_to(REPO_ROOT).as_posix())
    assert cited, "no code cites docs/architecture.md"
    missing = {n: files for n, files in cited.items() if n not in sections}
    assert missing == {}
