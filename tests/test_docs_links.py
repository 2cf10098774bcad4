"""README.md and docs/*.md point only at things that exist.

Every relative Markdown link names a real file (and, with ``#anchor``, a heading of it, as GitHub
makes anchors), and every backticked repository path (``memoriesd/vault/fsio.py``,
``scripts/test.sh``, ``docs/``) is a real file or folder of the checkout: moving or renaming a file
without fixing the docs fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "SECURITY.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = sorted(p.name for p in REPO.iterdir() if not p.name.startswith(".") and p.name not in {"build", "dist"})

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out: set[str] = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = m.group(1).strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def _repo_paths(text: str) -> set[str]:
    """Backticked tokens that name a path inside the repository (first part a top-level entry)."""
    found = set()
    for token in CODE.findall(text):
        token = token.strip()
        if " " in token or token.startswith(("../", "~/", "/", "HOME/")) or "*" in token or "<" in token:
            continue
        first = token.split("/")[0]
        if first in TOP and (len(token.split("/")) > 1 or "." in token):
            found.add(token.split("::")[0].split(":")[0])
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_real_file_and_heading(doc: Path) -> None:
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, file:, mailto:
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert broken == [], f"{doc.name}: links to nothing: {broken}"


def _expand(path: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (the shell's brace expansion, one level)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [x for part in m.group(1).split(",") for x in _expand(path[: m.start()] + part + path[m.end() :])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_backticked_repository_path_exists(doc: Path) -> None:
    named = [q for p in _repo_paths(doc.read_text(encoding="utf-8")) for q in _expand(p)]
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists())
    assert missing == [], f"{doc.name} names paths that do not exist: {missing}"


def test_the_readme_is_a_guide_under_400_lines_and_links_the_reference() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") < 400
    for doc in (REPO / "docs").glob("*.md"):
        assert f"(docs/{doc.name})" in readme, f"README does not link docs/{doc.name}"
    assert "bash scripts/test.sh" in readme
