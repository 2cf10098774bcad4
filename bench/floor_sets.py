"""The evaluation sets of ``bench/calibrate_floor.py``: documents, on-topic queries and their judgments.

Each set is a list of documents ``(doc_id, title, text)`` and on-topic queries ``(query_id, text, {doc_id})``,
built deterministically from files on this machine:

- ``scifact``: ``../shared/eval/scifact`` (test qrels), English scientific abstracts;
- ``xquad-zh``: ``../shared/eval/xquad-zh``, Chinese Wikipedia paragraphs;
- ``tldr``: English pages of ``../shared/eval/tldr.tar.gz`` (``pages/common`` and ``pages/linux``, every
  ``stride``-th in path order); a page's description line (``> ...``) is its query, the page the answer;
- ``code-md``: the Node.js API reference installed with the distribution's nodejs
  (``/usr/share/doc/nodejs/api/*.md``), cut at ``##``/``###`` headings: code-heavy Markdown; a section's
  heading (backticks and signatures stripped to words) is its query, the section the answer.

Sets can be cut to ``max_docs`` documents (the judged ones first) for slow models.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
EVAL = SHARED / "eval"
NODE_API = Path("/usr/share/doc/nodejs/api")


@dataclass
class EvalSet:
    name: str
    docs: list[tuple[str, str, str]]  # (doc id, title, text)
    queries: list[tuple[str, str, set[str]]] = field(
        default_factory=list
    )  # (query id, text, relevant doc ids)


def _jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def beir(name: str, root: Path, max_queries: int) -> EvalSet:
    docs = [(d["_id"], d.get("title") or "", d["text"]) for d in _jsonl(root / "corpus.jsonl")]
    qtext = {q["_id"]: q["text"] for q in _jsonl(root / "queries.jsonl")}
    rel: dict[str, set[str]] = {}
    for line in (root / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")[:3]
        if float(score) > 0:
            rel.setdefault(qid, set()).add(did)
    queries = [(qid, qtext[qid], dids) for qid, dids in sorted(rel.items()) if qid in qtext][:max_queries]
    return EvalSet(name, docs, queries)


def tldr(stride: int, max_queries: int) -> EvalSet:
    docs: list[tuple[str, str, str]] = []
    queries: list[tuple[str, str, set[str]]] = []
    with tarfile.open(EVAL / "tldr.tar.gz") as tar:
        members = sorted(
            (
                m
                for m in tar.getmembers()
                if m.isfile() and re.search(r"(^|/)pages/(common|linux)/[^/]+\.md$", m.name)
            ),
            key=lambda m: m.name,
        )
        for m in members[::stride]:
            f = tar.extractfile(m)
            if f is None:
                continue
            text = f.read().decode("utf-8")
            did = m.name.split("pages/", 1)[1]
            title = Path(did).stem
            docs.append((did, title, text))
            desc = [
                line[1:].strip()
                for line in text.splitlines()
                if line.startswith(">") and "More information" not in line
            ]
            if desc:
                queries.append((did, desc[0], {did}))
    step = max(1, len(queries) // max_queries)
    return EvalSet("tldr", docs, queries[::step][:max_queries])


_HEADING = re.compile(r"^(#{2,3}) (.+)$", re.M)


def _query_of(heading: str) -> str:
    words = re.sub(r"[`*_]|\(.*?\)|<[^>]*>|\[[^\]]*\]", " ", heading)
    words = re.sub(r"[.:#]", " ", words)
    return " ".join(words.split())


def code_md(max_queries: int) -> EvalSet:
    docs: list[tuple[str, str, str]] = []
    queries: list[tuple[str, str, set[str]]] = []
    for path in sorted(NODE_API.glob("*.md")):
        text = path.read_text(encoding="utf-8", errors="replace")
        marks = list(_HEADING.finditer(text))
        for i, m in enumerate(marks):
            body = text[m.start() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
            if len(body) < 200:
                continue
            did = f"{path.stem}#{i}"
            docs.append((did, path.stem, body))
            q = _query_of(m.group(2))
            if len(q.split()) >= 2:
                queries.append((did, q, {did}))
    step = max(1, len(queries) // max_queries)
    return EvalSet("code-md", docs, queries[::step][:max_queries])


def subset(s: EvalSet, max_docs: int, max_queries: int) -> EvalSet:
    """At most ``max_docs`` documents: those the first ``max_queries`` queries judge, then others in order."""
    queries = s.queries[:max_queries]
    if len(s.docs) <= max_docs:
        return EvalSet(s.name, s.docs, queries)
    judged = {d for _, _, rel in queries for d in rel}
    keep = [d for d in s.docs if d[0] in judged]
    if len(keep) > max_docs:
        keep = keep[:max_docs]
    keep_ids = {d[0] for d in keep}
    keep += [d for d in s.docs if d[0] not in keep_ids][: max_docs - len(keep)]
    keep_ids = {d[0] for d in keep}
    return EvalSet(s.name, keep, [q for q in queries if q[2] & keep_ids])


def load(name: str, max_queries: int = 300) -> EvalSet:
    if name == "scifact":
        return beir(name, EVAL / "scifact", max_queries)
    if name == "xquad-zh":
        return beir(name, EVAL / "xquad-zh", max_queries)
    if name == "tldr":
        return tldr(stride=2, max_queries=max_queries)
    if name == "code-md":
        return code_md(max_queries)
    raise SystemExit(f"unknown set {name}")


__all__ = ["EvalSet", "code_md", "load", "subset", "tldr"]
