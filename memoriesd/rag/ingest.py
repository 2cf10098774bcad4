"""`rag ingest`: UTF-8/Markdown files (or stdin text) into encrypted knowledge cards.

A file's resolved absolute path (safe metadata ``source``) is its card's identity, whatever the
working directory it was named from (the CLI makes paths absolute) and however it was named (``..``,
symbolic links to its folder): it is also the ``source`` results show. An unchanged file is a
no-op, a changed file a new revision of the same card, and a new path whose bytes are those of a
card whose file is gone is that file moved or renamed: the card keeps its id. In a directory
(``--recursive``) a symbolic link whose real path is outside that directory is never read: it is
skipped and reported (``skipped_outside``); a link named on the command line is followed. Records
are made durable in groups (one fsync + head commit per group); a file is reported only once its
group is durable, so an interrupted ingest leaves every reported file in the vault and no partial
card.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import DocumentRefused, UsageError
from ..text.files import ParsedDocument, PathKeys, discover, parse_document, read_document
from ..vault.records import Record, new_record_id, now
from ..vault.store import VaultStore
from .host import Work

GROUP_FILES = 64
GROUP_BYTES = 8 * 1024 * 1024


@dataclass
class IngestRequest:
    paths: list[str]
    recursive: bool = False
    title: str | None = None
    tags: list[str] = field(default_factory=list)
    private: bool = False
    prune: bool = False
    text: str | None = None  # stdin content (needs title, never deduplicated)
    base: str | None = None  # a folder the shown paths of named files are relative to (a watched folder)


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    moved: int = 0  # cards re-pointed to the new path of their moved or renamed (unchanged) file
    pruned: int = 0
    refused: list[dict[str, str]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    # Symbolic links found in a directory that lead out of it (never read), as shown paths.
    skipped_outside: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "moved": self.moved,
            "pruned": self.pruned,
            "refused": self.refused,
            "skipped_outside": len(self.skipped_outside),
            "skipped_outside_paths": self.skipped_outside,
            "records": self.records,
        }


def _merge_tags(cli_tags: list[str], meta: dict[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    fm = meta.get("tags")
    fm_list = fm if isinstance(fm, list) else ([fm] if isinstance(fm, str) and fm else [])
    for t in [*cli_tags, *fm_list]:
        t = str(t).strip()
        if t and t not in out and len(t) <= 100:
            out.append(t)
    return tuple(out[:64])


def _cards_by_source(store: VaultStore) -> dict[str, Record]:
    return {str(r.meta["source"]): r for r in store.latest() if r.kind == "card" and r.meta.get("source")}


def _card(prev: Record | None, title: str, body: str, tags: tuple[str, ...], private: bool, meta: dict[str, Any]) -> Record:
    t = now()
    if prev is None:
        return Record(new_record_id(), 1, "card", title, body, private, tags, meta=meta, created=t, updated=t)
    return Record(prev.id, prev.revision + 1, "card", title, body, private, tags, meta=meta, private_meta=prev.private_meta, created=prev.created, updated=t)


def _is_dir(path: Path) -> bool:
    """``Path.is_dir`` raises for a name too long or a path it may not search: discover() refused those."""
    try:
        return path.is_dir()
    except OSError:
        return False


def run_ingest(store: VaultStore, req: IngestRequest, ctx: Work, *, max_bytes: int) -> IngestReport:
    if req.text is not None:
        return _ingest_text(store, req, req.text, max_bytes)
    roots = [Path(p) for p in req.paths]
    for p in roots:
        if not p.is_absolute():
            raise UsageError("ingest paths must be absolute (the CLI resolves them)")
    report = IngestReport()
    keys = PathKeys()
    outside: list[Path] = []
    files, problems = discover(roots, recursive=req.recursive, keys=keys, outside=outside)
    dir_roots = [r for r in roots if _is_dir(r)] + ([Path(req.base)] if req.base else [])
    for path, why in problems:
        report.refused.append({"path": str(path), "message": why})
    report.skipped_outside = [_relative(p, dir_roots) for p in outside]
    existing = _cards_by_source(store)
    moves = _Moves(existing)
    batch = _Batch(store, ctx, report, total=len(files))
    seen_sources: set[str] = set()
    for path in files:
        batch.done += 1
        ctx.check_cancelled()
        resolved = keys.key(path)
        shown = _relative(path, dir_roots)
        read = _read(path, req.title, max_bytes, report)
        if read is None or resolved in seen_sources:
            continue
        data, parsed = read
        seen_sources.add(resolved)
        digest = hashlib.sha256(data).hexdigest()
        tags = _merge_tags(req.tags, parsed.meta)
        meta = {k: v for k, v in parsed.meta.items() if k != "tags"}
        meta.update({"source": resolved, "path": shown, "sha256": digest})
        prev = existing.get(resolved)
        status = "added" if prev is None else "updated"
        if prev is None and (prev := moves.take(digest)) is not None:
            status = "moved"
        elif prev is not None and prev.meta.get("sha256") == digest and prev.title == parsed.title and prev.tags == tags and prev.private == req.private:
            report.unchanged += 1
            continue
        private = req.private or (status == "moved" and prev is not None and prev.private)  # a move keeps a card private
        batch.add(_card(prev, parsed.title, parsed.body, tags, private, meta), status, shown, len(data))
    batch.flush()
    if req.prune:
        report.pruned = _prune(store, ctx, roots, seen_sources)
    ctx.send_progress({"done": batch.total, "total": batch.total, "durable": []})
    return report


def _ingest_text(store: VaultStore, req: IngestRequest, text: str, max_bytes: int) -> IngestReport:
    """Stdin text: always a new card (no path to know it by again)."""
    if not req.title:
        raise UsageError("ingesting stdin (-) needs --title")
    parsed = parse_document(text.encode("utf-8"), "stdin", title=req.title, max_bytes=max_bytes)
    meta: dict[str, Any] = {k: v for k, v in parsed.meta.items() if k != "tags"}
    rec = _card(None, parsed.title, parsed.body, _merge_tags(req.tags, parsed.meta), req.private, meta)
    store.commit([rec])
    report = IngestReport(added=1)
    report.records.append({"id": rec.id, "revision": rec.revision, "title": rec.title, "status": "added"})
    return report


def _read(path: Path, title: str | None, max_bytes: int, report: IngestReport) -> tuple[bytes, ParsedDocument] | None:
    """The file's bytes and parsed document, or None with the reason in ``report.refused``."""
    try:
        data = read_document(path, max_bytes)  # regular files only, at most max_bytes + 1 read
    except OSError as exc:
        report.refused.append({"path": str(path), "message": f"{path.name} cannot be read ({exc.strerror})"})
        return None
    except DocumentRefused as exc:
        report.refused.append({"path": str(path), "message": exc.message})
        return None
    try:
        return data, parse_document(data, path.name, title=title, max_bytes=max_bytes)
    except DocumentRefused as exc:
        report.refused.append({"path": str(path), "message": exc.message})
        return None


@dataclass
class _Batch:
    """Cards made durable together (one commit per group of files or bytes); a file is reported, and
    counted, only once its group is durable."""

    store: VaultStore
    ctx: Work
    report: IngestReport
    total: int
    done: int = 0  # files looked at so far
    pending: list[tuple[Record, str, str]] = field(default_factory=list)  # (card, status, shown path)
    pending_bytes: int = 0

    def add(self, rec: Record, status: str, shown: str, size: int) -> None:
        self.pending.append((rec, status, shown))
        self.pending_bytes += size
        if len(self.pending) >= GROUP_FILES or self.pending_bytes >= GROUP_BYTES:
            self.flush()
        elif self.done % 50 == 0:
            self.ctx.send_progress({"done": self.done, "total": self.total, "durable": []})

    def flush(self) -> None:
        if not self.pending:
            return
        self.ctx.check_cancelled()
        store, report = self.store, self.report
        with store.exclusive():  # re-based on the current revisions, written in the same critical section
            pending = [(_rebase(store, rec), status, shown) for rec, status, shown in self.pending]
            store.commit([r for r, _, _ in pending])
        for rec, status, shown in pending:
            if status == "added":
                report.added += 1
            elif status == "moved":
                report.moved += 1
            else:
                report.updated += 1
            report.records.append({"id": rec.id, "revision": rec.revision, "title": rec.title, "status": status, "path": shown,
                                   "source": rec.meta["source"]})
        self.pending, self.pending_bytes = [], 0
        self.ctx.send_progress({"done": self.done, "total": self.total, "durable": [shown for _, _, shown in pending]})


def _prune(store: VaultStore, ctx: Work, roots: list[Path], seen_sources: set[str]) -> int:
    """Delete the cards of files gone from under the named directories; how many."""
    dirs = [str(p.resolve()) for p in roots if p.is_dir()]
    if not dirs:
        raise UsageError("--prune needs a directory among the paths")
    gone = []
    for source, rec in _cards_by_source(store).items():
        under = any(source.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)
        if under and source not in seen_sources and not os.path.exists(source):
            gone.append(Record(rec.id, rec.revision + 1, rec.kind, "", "", rec.private, (), created=rec.created, updated=now(), deleted=True))
    if gone:
        ctx.check_cancelled()
        store.commit(gone)
    return len(gone)


class _Moves:
    """Cards whose source file is gone, by content digest (built on first use): a new file with the
    same bytes is that card's file moved or renamed, so the card keeps its id and is re-pointed."""

    def __init__(self, cards: dict[str, Record]) -> None:
        self._cards = cards
        self._by_digest: dict[str, list[Record]] | None = None

    def take(self, digest: str) -> Record | None:
        if self._by_digest is None:
            self._by_digest = {}
            for rec in self._cards.values():
                if rec.meta.get("sha256"):
                    self._by_digest.setdefault(str(rec.meta["sha256"]), []).append(rec)
        candidates = self._by_digest.get(digest, [])
        for i, rec in enumerate(candidates):
            if not os.path.exists(str(rec.meta["source"])):
                return candidates.pop(i)  # claimed: a second copy of the same bytes is a new card
        return None


def _rebase(store: VaultStore, rec: Record) -> Record:
    """``rec`` as the next revision of its card as the vault holds it now.

    The card may have changed since the ingest read it (``memory update``, a delete, a tag): the
    file's content is what the ingest writes, as the revision after the current one.
    Caller is inside ``store.exclusive()``.
    """
    current = store.revisions(rec.id)
    if not current or current[-1].revision == rec.revision - 1:
        return rec
    return replace(rec, revision=current[-1].revision + 1)


def _relative(path: Path, dir_roots: list[Path]) -> str:
    """The path as the user sees it: relative to the directory (of those given) it was found under."""
    for root in dir_roots:
        try:
            return str(path.relative_to(root))
        except ValueError:
            continue
    return path.name
