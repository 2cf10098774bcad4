"""Reconcile a watched folder with its vault: what changed on disk becomes cards, through `rag ingest`.

A sync gets the paths that changed (files) and the folders to rescan (a folder created, moved or
deleted, or the whole watched folder at unlock). Files that exist go through
:func:`~memoriesd.rag.ingest.run_ingest` (its refusals, its group-commit durability, its no-op for
unchanged files and its moved-file detection); with ``prune``, the cards of files that are gone are
deleted. A symbolic link in the folder whose real path is outside it (a file or a folder) is never
read: it is skipped and counted (``skipped_outside``). Nothing is ever pruned while the watched folder itself is missing or unreadable, nor
under a subfolder that could not be read; and a rescan that finds the watched folder empty prunes
nothing either (an unmounted disk leaves an empty mount point): only the deletion of a file seen
as it happens removes the card of the last file.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..config import WatchConfig
from ..rag.host import Work
from ..rag.ingest import IngestRequest, run_ingest
from ..text.files import TEXT_SUFFIXES, leaves_folder
from ..vault.records import Record, now
from ..vault.store import VaultStore

#: Refusals kept per sync for `rag status` (the count is always whole).
MAX_REFUSALS_SHOWN = 20


class FolderProblem(Exception):
    """The watched folder cannot be synced now (missing, not a folder, unreadable): one line, no path."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class SyncResult:
    added: int = 0
    updated: int = 0
    moved: int = 0
    unchanged: int = 0
    removed: int = 0
    held: int = 0  # cards not pruned because the watched folder was found empty
    refused: list[dict[str, str]] = field(default_factory=list)
    refused_count: int = 0
    retry: set[str] = field(default_factory=set)  # files that changed while they were read
    skipped_outside: int = 0  # symbolic links that lead out of the watched folder (never read)

    @property
    def changed(self) -> int:
        return self.added + self.updated + self.moved + self.removed


def check_root(path: str) -> None:
    """Raise :class:`FolderProblem` unless ``path`` is a readable folder."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FolderProblem(
            "the folder does not exist (moved, deleted or not mounted?): nothing is removed while it is "
            "missing; restore it, or stop watching it with `memories rag unwatch`"
        ) from None
    except OSError as exc:
        raise FolderProblem(f"the folder cannot be read ({exc.strerror or 'error'}): check it and its permissions") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FolderProblem("the path is no longer a folder: restore the folder, or stop watching it with `memories rag unwatch`")
    if not os.access(path, os.R_OK | os.X_OK):
        raise FolderProblem("the folder cannot be read (permission denied): fix its permissions; nothing is removed meanwhile")


def wanted(rel: str, watch: WatchConfig) -> bool:
    """Whether a path relative to the watched folder is one of its files (not whether it exists).

    Hidden files and folders are never taken; without ``recursive`` only the folder's own files;
    ``include`` globs without a ``/`` match the file name, globs with one the relative path;
    no globs = ``*.md``, ``*.markdown``, ``*.txt``.
    """
    if not rel or rel == "." or rel.startswith(".." + os.sep) or rel == ".." or os.path.isabs(rel):
        return False
    parts = rel.split(os.sep)
    if any(p.startswith(".") for p in parts) or (not watch.recursive and len(parts) > 1):
        return False
    name = parts[-1]
    if not watch.include:
        return name.lower().endswith(TEXT_SUFFIXES)
    posix = "/".join(parts)
    return any(fnmatch.fnmatchcase(posix if "/" in g else name, g) for g in watch.include)


def folder_wanted(folder: str, root: str, watch: WatchConfig) -> bool:
    """Whether files under ``folder`` can be the watch's: the watched folder, or (recursive) a visible subfolder."""
    if folder == root:
        return True
    rel = os.path.relpath(folder, root)
    if rel == ".." or rel.startswith(".." + os.sep):
        return False
    return watch.recursive and not any(p.startswith(".") for p in rel.split(os.sep))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def scan(root: str, start: str, watch: WatchConfig, exclude: str, outside: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Files of the watch under ``start`` (a folder in ``root``), and folders that could not be read.

    Symbolic links to folders are never entered (``os.walk`` does not follow them), so a link loop
    cannot make the walk endless; hidden folders and the Memories home (``exclude``) are skipped.
    Links (to files or folders) whose real path is outside ``root`` are left out and go to ``outside``.
    """
    files: list[str] = []
    unreadable: list[str] = []
    real_root = os.path.realpath(root)
    away = outside if outside is not None else []

    def onerror(exc: OSError) -> None:
        unreadable.append(str(exc.filename) if exc.filename else start)

    for dirpath, dirnames, filenames in os.walk(start, onerror=onerror):
        if watch.recursive:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not _under(os.path.join(dirpath, d), exclude))
            away.extend(sub for sub in (os.path.join(dirpath, d) for d in dirnames) if leaves_folder(sub, real_root))
        else:
            dirnames[:] = []
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if wanted(os.path.relpath(p, root), watch):
                (away if leaves_folder(p, real_root) else files).append(p)
    return files, unreadable


def _cards(store: VaultStore) -> dict[str, Record]:
    """Live cards by their source (as `rag ingest` keys them)."""
    return {str(r.meta["source"]): r for r in store.latest() if r.kind == "card" and r.meta.get("source")}


def _key(path: str) -> str:
    """A file's card source as `rag ingest` computes it: its resolved folder plus its name."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def sync(
    store: VaultStore,
    watch: WatchConfig,
    ctx: Work,
    *,
    paths: Iterable[str] = (),
    folders: Iterable[str] = (),
    max_bytes: int,
    exclude: str,
) -> SyncResult:
    """Bring the vault in line with ``paths`` (changed files) and ``folders`` (rescanned whole)."""
    root = watch.path
    check_root(root)
    real_root = os.path.realpath(root)
    files: dict[str, None] = {}
    gone: list[str] = []
    gone_folders: list[str] = []
    unreadable: list[str] = []
    outside: list[str] = []
    empty_root = False
    for folder in sorted(set(folders)):
        if not folder_wanted(folder, root, watch) or (folder != root and _under(folder, exclude)):
            continue
        if os.path.isdir(folder) and not os.path.islink(folder):
            found, bad = scan(root, folder, watch, exclude, outside)
            empty_root = empty_root or (folder == root and not found)
            files.update(dict.fromkeys(found))
            unreadable.extend(bad)
        gone_folders.append(folder)  # cards under it whose file is gone are pruned too
    for p in sorted(set(paths)):
        if p in files or p in outside or _under(p, exclude) or not wanted(os.path.relpath(p, root), watch):
            continue
        if os.path.lexists(p):
            if leaves_folder(p, real_root):
                outside.append(p)
            elif not os.path.isdir(p):
                files[p] = None
        else:
            gone.append(p)
    result = SyncResult(skipped_outside=len(set(outside)))
    if files:
        _ingest(store, watch, ctx, list(files), max_bytes, result)
    if watch.prune:
        ctx.check_cancelled()
        present = {_key(f) for f in files}
        result.removed, result.held = _prune(store, watch, real_root, gone, gone_folders, unreadable, present, hold=empty_root)
    return result


def _ingest(store: VaultStore, watch: WatchConfig, ctx: Work, files: list[str], max_bytes: int, result: SyncResult) -> None:
    """Ingest ``files``; a card that is private stays private (its file's changes stay unsearchable)."""
    cards = _cards(store)
    private = {p for p in files if (c := cards.get(_key(p))) is not None and c.private}
    public = [p for p in files if p not in private]
    stamps = {p: _stamp(p) for p in files}
    for group, is_private in ((public, False), (sorted(private), True)):
        if not group:
            continue
        req = IngestRequest(paths=group, private=is_private, base=watch.path)
        report = run_ingest(store, req, ctx, max_bytes=max_bytes)
        result.added += report.added
        result.updated += report.updated
        result.moved += report.moved
        result.unchanged += report.unchanged
        # A file gone between the event and the read is a deletion, handled by its own event.
        vanished = {p for p in group if not os.path.lexists(p)}
        refused = [r for r in report.refused if r["path"] not in vanished]
        result.refused_count += len(refused)
        result.refused.extend(refused[: max(0, MAX_REFUSALS_SHOWN - len(result.refused))])
    # Written while it was read (size or time changed): read it again once it settles.
    result.retry = {p for p in files if _stamp(p) != stamps[p] and os.path.lexists(p)}


def _prune(
    store: VaultStore,
    watch: WatchConfig,
    real_root: str,
    gone: list[str],
    gone_folders: list[str],
    unreadable: list[str],
    present: set[str],
    *,
    hold: bool,
) -> tuple[int, int]:
    """Delete the cards of this watch's files that no longer exist: (deleted, held).

    ``present``: sources of the files just found (no need to look at the disk for them).
    ``hold``: the watched folder was found empty, so cards found only by rescanning are kept (held).
    """
    keys = {_key(p) for p in gone}
    folders = [os.path.realpath(f) for f in gone_folders]
    skip = [os.path.realpath(u) for u in unreadable]
    held = 0
    candidates: list[Record] = []
    for source, rec in _cards(store).items():
        if source in present or (source not in keys and not any(_under(source, f) for f in folders)):
            continue
        if not _under(source, real_root) or any(_under(source, u) for u in skip):
            continue
        if not wanted(os.path.relpath(source, real_root), watch) or os.path.exists(source):
            continue
        if hold and source not in keys:
            held += 1
            continue
        candidates.append(rec)
    with store.exclusive():  # against the current revisions: a card re-pointed or changed meanwhile is kept
        doomed: list[Record] = []
        current = store.current(rec.id for rec in candidates)
        for rec in candidates:
            last = current.get(rec.id)
            if last is None or last.meta.get("source") != rec.meta.get("source"):
                continue
            doomed.append(Record(last.id, last.revision + 1, last.kind, "", "", last.private, (), created=last.created, updated=now(), deleted=True))
        if doomed:
            store.commit(doomed)
    return len(doomed), held


__all__ = ["FolderProblem", "SyncResult", "check_root", "folder_wanted", "scan", "sync", "wanted"]
