"""Every link and repository path the README and docs/ name leads somewhere.

Relative links must name a file of the repository (and, with ``#anchor``, one of its
headings); a path in backticks that starts with one of the repository's folders must
exist, so a renamed test or benchmark cannot leave a claim pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.processes import REPO_ROOT

TOP_DIRS = ("proxy", "tests", "bench", "scripts", "deploy", "docker", "docs")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:" + "|".join(TOP_DIRS) + r")/[A-Za-z0-9_./-]*)`")


def documents() -> list[Path]:
    docs = sorted((REPO_ROOT / "docs").glob("*.md"))
    return [
        REPO_ROOT / "README.md",
        *[p for p in [REPO_ROOT / "CONTRIBUTING.md"] if p.exists()],
        *docs,
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text("utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text("utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        has_anchor = not anchor or dest.suffix != ".md" or anchor in anchors(dest)
        if not (dest.exists() and has_anchor):
            broken.append(target)
    return broken


def missing_paths(path: Path) -> list[str]:
    text = path.read_text("utf-8")
    return [p for p in CODE_PATH.findall(text) if not (REPO_ROOT / p.rstrip("/.")).exists()]


def test_slugs_follow_github() -> None:
    assert slug("6. Trimming") == "6-trimming"
    assert slug("3. Paths, routes and keys") == "3-paths-routes-and-keys"
    assert slug("`trimproxy plan`: KV memory") == "trimproxy-plan-kv-memory"


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    found = {p.name: b for p in documents() if (b := broken_links(p))}
    assert found == {}


def test_every_repository_path_in_backticks_exists() -> None:
    found = {p.name: m for p in documents() if (m := missing_paths(p))}
    assert found == {}
