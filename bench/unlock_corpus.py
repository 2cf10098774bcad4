"""The deterministic Markdown folder of ``bench_unlock_first_answer.py``: real pages, written once.

Layers, in this order, repeated ("rounds") until the target fragment count is reached: the tldr
pages (``../shared/eval/tldr.tar.gz``, every language, as the archive lists them), SciFact abstracts
as notes (``# title`` + text) and XQuAD-zh paragraphs as notes. Rounds after the first append
``(copy N)`` to each file, so no two files share their bytes (a card whose file is gone and whose
bytes reappear elsewhere would be taken as moved). Fragments are counted with the daemon's own
splitter; the daemon's count (``rag status``) is what the benchmark reports.

Each target writes its own subfolder (``a/`` up to the first size, ``b/`` the rest up to the
second...), so a vault grows by ingesting one more subfolder. A ``manifest.json`` records what was
written: a folder with a manifest for the same targets is reused as it is.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memoriesd.text.fragments import split_fragments

SHARED = Path(__file__).resolve().parents[2] / "shared"
TLDR = SHARED / "eval" / "tldr.tar.gz"
SCIFACT = SHARED / "eval" / "scifact" / "corpus.jsonl"
XQUAD = SHARED / "eval" / "xquad-zh" / "corpus.jsonl"
_KEY = bytes(32)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _pages() -> list[tuple[str, str]]:
    """(relative name, text) of every tldr Markdown page, in archive order."""
    out: list[tuple[str, str]] = []
    with tarfile.open(TLDR) as tar:
        for m in tar:
            if m.isfile() and m.name.endswith(".md") and "/pages" in m.name:
                f = tar.extractfile(m)
                if f is not None:
                    out.append((m.name.split("/", 1)[1], f.read().decode("utf-8", "replace")))
    return out


def _round_files(
    pages: list[tuple[str, str]], sci: list[dict[str, Any]], xq: list[dict[str, Any]], n: int
) -> Iterator[tuple[str, str]]:
    tag = "" if n == 0 else f"\n(copy {n})\n"
    for name, text in pages:
        yield f"r{n}/tldr/{name}", text + tag
    for d in sci:
        title = " ".join((d.get("title") or "").split()) or "untitled"
        yield f"r{n}/scifact/{d['_id']}.md", f"# {title}\n\n{d.get('text') or '-'}\n{tag}"
    for i, d in enumerate(xq):
        yield f"r{n}/xquad/{i:04d}.md", f"# 段落 {i}\n\n{d.get('text') or '-'}\n{tag}"


def write_corpus(root: Path, targets: list[int]) -> dict[str, Any]:
    """Write (or reuse) ``root/<letter>/`` folders holding ``targets`` fragments in total, cumulatively."""
    manifest_path = root / "manifest.json"
    if manifest_path.exists():
        got = json.loads(manifest_path.read_text("utf-8"))
        if got.get("targets", [])[: len(targets)] == targets:  # the same folders, maybe more of them
            return dict(got)
    pages, sci, xq = _pages(), _jsonl(SCIFACT), _jsonl(XQUAD)
    root.mkdir(parents=True, exist_ok=True)
    parts: list[dict[str, Any]] = []
    total = files = nbytes = 0
    rnd = 0
    stream = _round_files(pages, sci, xq, rnd)
    for k, target in enumerate(targets):
        folder = root / chr(ord("a") + k)
        p_files = p_bytes = p_frags = 0
        while total < target:
            try:
                rel, text = next(stream)
            except StopIteration:
                rnd += 1
                stream = _round_files(pages, sci, xq, rnd)
                continue
            n = max(1, len(split_fragments("x", 1, text, _KEY)))
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            data = text.encode("utf-8")
            path.write_bytes(data)
            total += n
            p_frags += n
            p_files += 1
            p_bytes += len(data)
        files += p_files
        nbytes += p_bytes
        parts.append(
            {
                "folder": folder.name,
                "files": p_files,
                "mb": round(p_bytes / 1e6, 2),
                "fragments": p_frags,
                "cumulative_fragments": total,
            }
        )
    manifest = {"targets": targets, "parts": parts, "files": files, "mb": round(nbytes / 1e6, 2)}
    manifest_path.write_text(json.dumps(manifest, indent=1), "utf-8")
    return manifest


__all__ = ["write_corpus"]
