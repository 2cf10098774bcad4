"""The daemon's folder watches: ``[[watch.folder]]`` folders kept in sync with their vaults while unlocked.

At unlock (and when ``rag watch`` reloads the list) each folder of the vault gets a
:class:`~.watcher.FolderWatcher` and one catch-up sync of the whole folder (what changed while the
vault was locked; unchanged files are cheap no-ops). Then every change is queued and synced once the
folder has been quiet for ``[watch] debounce_seconds``. One worker thread runs every start and
sync, one at a time; each sync holds a background lease on the vault (so a lock cancels it at the
next file and waits for it) and the vault's ingest mutex (one ingest at a time, as ``rag ingest``).
Lock, delete and shutdown stop the vault's watchers; nothing about a folder outlives its vault's key
but counts and times.

A folder that disappears or cannot be read is an error state in ``rag status``, never a crash and
never a reason to prune: a health check every few seconds notices it and notices it coming back
(then the folder is watched again and caught up). The daemon log holds vault ids, folder numbers
and counts: never a file name, a title or a text.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import WatchConfig, load_config
from ..errors import Cancelled, MemoriesError, VaultLocked
from ..rag.host import Host
from ..vault.crypto import KeyWiped
from ..vault.live import VaultLock
from .sync import FolderProblem, check_root, folder_wanted, sync, wanted
from .watcher import FolderWatcher, Pending

log = logging.getLogger("memoriesd.watch")

#: How often the worker checks every folder (gone, back, watcher ended) and unlocked vaults.
HEALTH_SECONDS = 2.0
#: After a failed start or sync, the next attempt comes this much later.
RETRY_SECONDS = 30.0


class _SyncContext:
    """The request context of a sync: its stop checks (daemon stopping, vault closing)."""

    def __init__(self, stop: threading.Event, check: Callable[[], None]) -> None:
        self._stop = stop
        self._check = check

    def check_cancelled(self) -> None:
        if self._stop.is_set():
            raise Cancelled("the daemon is stopping")
        self._check()

    def send_progress(self, _progress: dict[str, Any]) -> None:
        return None


@dataclass
class Folder:
    """One watched folder of an unlocked vault, and what `rag status` says about it."""

    watch: WatchConfig
    vault_id: str
    number: int  # the table's position in config.toml (logs name folders by it, never by path)
    pending: Pending = field(default_factory=Pending)
    watcher: FolderWatcher | None = None
    needs_start: bool = True
    running: str = ""  # "catching_up" or "syncing" while a sync runs
    closed: bool = False
    error: str | None = None
    problem: bool = False  # the error is the folder itself (missing, unreadable): retried by the health check
    retry_at: float = 0.0
    last_sync: float | None = None  # wall-clock time of the last finished sync
    syncs: int = 0
    added: int = 0
    updated: int = 0
    moved: int = 0
    removed: int = 0
    notice: str | None = None  # from the last sync: cards kept because the folder was found empty
    refused_count: int = 0  # in the last sync
    refused: list[dict[str, str]] = field(default_factory=list)
    skipped_outside: int = 0  # in the last sync: symbolic links that lead out of the folder (never read)

    @property
    def state(self) -> str:
        if self.running:
            return self.running
        if self.error:
            return "error"
        if self.needs_start:
            return "starting"
        return "pending" if self.pending else "watching"

    def view(self) -> dict[str, Any]:
        return {
            **_watch_view(self.watch),
            "vault_id": self.vault_id,
            "state": self.state,
            "error": self.error,
            "notice": self.notice,
            "last_sync": self.last_sync,
            "pending": self.pending.count(),
            "syncs": self.syncs,
            "ingested": self.added + self.updated,
            "added": self.added,
            "updated": self.updated,
            "moved": self.moved,
            "removed": self.removed,
            "refused": self.refused_count,
            "refusals": list(self.refused),
            "skipped_outside": self.skipped_outside,
        }


def _watch_view(w: WatchConfig) -> dict[str, Any]:
    return {"vault": w.vault, "path": w.path, "recursive": w.recursive, "include": list(w.include), "prune": w.prune}


def _start_error(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the system's inotify watch limit is reached: raise fs.inotify.max_user_watches (sysctl) or watch fewer folders"
    if exc.errno == errno.EMFILE:
        return "the system's inotify instance limit is reached: raise fs.inotify.max_user_instances (sysctl)"
    return f"the folder cannot be watched ({exc.strerror or 'error'}): check it and its permissions"


class WatchService:
    """Every folder watch of the daemon (see the module docstring)."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self._cond = threading.Condition()
        self._watches: tuple[WatchConfig, ...] = app.config.watch.folders
        self._quiet = app.config.watch.debounce_seconds
        self._folders: dict[tuple[str, str], Folder] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exclude = os.path.realpath(app.home.root)  # the Memories home is never synced
        app.vaults.on_unlock(self._on_unlock)
        app.vaults.on_lock(self._on_lock)
        if self._watches:  # the health check starts the watches of vaults created later, too
            with self._cond:
                self._ensure_thread()

    @property
    def max_wait(self) -> float:
        return max(5.0, 10 * self._quiet)

    # ------------------------------------------------------------------ configuration

    def reload(self) -> dict[str, Any]:
        """Read the ``[[watch.folder]]`` tables (and the debounce) from config.toml again and apply them now."""
        path = self.app.home.config_path
        cfg = load_config(path)  # a broken file raises config_invalid and changes nothing
        with self._cond:
            self._watches = cfg.watch.folders
            self._quiet = cfg.watch.debounce_seconds
        self._reconcile()
        log.info("watch: the folder list was reloaded (%d folder(s) configured)", len(cfg.watch.folders))
        return {"config": str(path), "watches": self.overview()}

    def _resolve(self, watches: tuple[WatchConfig, ...]) -> list[tuple[int, WatchConfig, str | None, str | None]]:
        """(number, watch, vault id or None, error or None) for every configured watch."""
        out: list[tuple[int, WatchConfig, str | None, str | None]] = []
        for i, w in enumerate(watches, 1):
            try:
                out.append((i, w, self.app.vaults.resolve(w.vault), None))
            except MemoriesError as exc:
                out.append((i, w, None, exc.message))
        return out

    def _reconcile(self) -> None:
        """Start the watches of unlocked vaults that have none yet; stop those no longer configured."""
        with self._cond:
            watches = self._watches
        desired: dict[tuple[str, str], tuple[int, WatchConfig]] = {}
        for i, w, vault_id, _err in self._resolve(watches):
            if vault_id is not None and self.app.vaults.live(vault_id) is not None:
                desired.setdefault((vault_id, w.path), (i, w))
        stopped: list[Folder] = []
        with self._cond:
            for key, folder in list(self._folders.items()):
                want = desired.get(key)
                if want is None or want[1] != folder.watch:
                    folder.closed = True
                    stopped.append(self._folders.pop(key))
            for key, (i, w) in desired.items():
                if key in self._folders:
                    self._folders[key].number = i
                else:
                    self._folders[key] = Folder(w, key[0], i)
            if self._folders or self._watches:
                self._ensure_thread()
            self._cond.notify_all()
        for folder in stopped:
            if folder.watcher is not None:
                folder.watcher.stop()

    def _on_unlock(self, vault_id: str) -> None:
        if self._watches:
            self._reconcile()

    def _on_lock(self, vault_id: str) -> None:
        """Runs while the vault closes, after its in-flight syncs ended: stop its watchers."""
        with self._cond:
            gone = [self._folders.pop(k) for k in [k for k in self._folders if k[0] == vault_id]]
            for folder in gone:
                folder.closed = True
            self._cond.notify_all()
        for folder in gone:
            if folder.watcher is not None:
                folder.watcher.stop()
        if gone:
            log.info("watch: vault %s: stopped watching %d folder(s)", vault_id, len(gone))

    # ------------------------------------------------------------------ status

    def overview(self) -> list[dict[str, Any]]:
        """Every configured watch: its live state, ``locked`` or an error naming what is wrong."""
        with self._cond:
            watches = self._watches
        rows = []
        for _i, w, vault_id, err in self._resolve(watches):
            with self._cond:
                folder = self._folders.get((vault_id, w.path)) if vault_id else None
                view = folder.view() if folder is not None and folder.watch == w else None
            if view is None:
                view = {**_watch_view(w), "vault_id": vault_id, "error": err, "pending": 0, "last_sync": None}
                if err is not None:
                    view["state"] = "error"
                else:
                    view["state"] = "locked" if self.app.vaults.live(str(vault_id)) is None else "starting"
            rows.append(view)
        return rows

    def status(self, vault_id: str) -> list[dict[str, Any]]:
        """The watched folders of one vault, for `rag status`."""
        return [v for v in self.overview() if v["vault_id"] == vault_id]

    # ------------------------------------------------------------------ events

    def _note(self, folder: Folder, path: str | None = None, sub: str | None = None) -> None:
        """A change seen by the folder's watcher (its observer thread): queue it, cheaply."""
        root = folder.watch.path
        if path is not None and (path.startswith(self._exclude + os.sep) or not wanted(os.path.relpath(path, root), folder.watch)):
            return  # not one of its files (a hidden or temporary file, another extension...)
        if sub is not None and (sub.startswith(self._exclude + os.sep) or not folder_wanted(sub, root, folder.watch)):
            return  # a hidden folder (.git...) or, without recursive, a subfolder
        with self._cond:
            if folder.closed:
                return
            folder.pending.add(time.monotonic(), path=path, folder=sub)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the worker

    def _ensure_thread(self) -> None:
        if self._stop.is_set():
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="memoriesd-watch", daemon=True)
            self._thread.start()

    def _next_job(self) -> tuple[str, Folder | None] | None:
        """Under the lock: a start (marked running) or a sync that is due, else None."""
        now = time.monotonic()
        for folder in self._folders.values():
            if folder.running or now < folder.retry_at:
                continue
            if folder.needs_start:
                if not folder.problem:
                    folder.running = "starting"
                    return "start", folder
                continue
            due = folder.pending.due(self._quiet, self.max_wait)
            if due is not None and due <= now:
                return "sync", folder
        return None

    def _wake_time(self, health_at: float) -> float:
        times = [health_at]
        for folder in self._folders.values():
            due = folder.pending.due(self._quiet, self.max_wait)
            if due is not None:
                times.append(max(due, folder.retry_at))
            if folder.needs_start and not folder.problem:
                times.append(folder.retry_at)
        return min(times)

    def _run(self) -> None:
        health_at = time.monotonic() + HEALTH_SECONDS
        while not self._stop.is_set():
            paths: set[str] = set()
            subs: set[str] = set()
            with self._cond:
                job = self._next_job()
                if job is None and time.monotonic() < health_at:
                    self._cond.wait(max(0.01, self._wake_time(health_at) - time.monotonic()))
                    continue
                if job is not None and job[0] == "sync":
                    folder = job[1]
                    assert folder is not None
                    paths, subs = folder.pending.take()
                    folder.running = "catching_up" if folder.watch.path in subs else "syncing"
            try:
                if job is None:
                    health_at = time.monotonic() + HEALTH_SECONDS
                    self._health()
                elif job[0] == "start":
                    assert job[1] is not None
                    self._start(job[1])
                else:
                    assert job[1] is not None
                    self._sync(job[1], paths, subs)
            except Exception as exc:  # the worker never dies; the message may hold a path: not logged
                log.error("watch: an internal error (%s) in a folder %s", type(exc).__name__, job[0] if job else "check")
            finally:
                if job is not None and job[1] is not None:
                    with self._cond:
                        job[1].running = ""
                        self._cond.notify_all()

    def _start(self, folder: Folder) -> None:
        """Start the folder's watcher, then queue the catch-up sync of the whole folder."""
        w = folder.watch
        try:
            check_root(w.path)
        except FolderProblem as p:
            self._fail(folder, p.message, problem=True)
            return
        watcher = FolderWatcher(w.path, w.recursive, lambda p: self._note(folder, path=p), lambda s: self._note(folder, sub=s))
        try:
            watcher.start()
        except OSError as exc:
            self._fail(folder, _start_error(exc), problem=exc.errno == errno.ENOENT)
            return
        with self._cond:
            if folder.closed:
                closed = True
            else:
                closed = False
                folder.watcher, folder.needs_start, folder.error, folder.problem = watcher, False, None, False
                folder.pending.add(time.monotonic() - self.max_wait, folder=w.path)  # due now: catch up
                self._cond.notify_all()
        if closed:
            watcher.stop()
        else:
            log.info("watch: vault %s: watching folder %d", folder.vault_id, folder.number)

    def _fail(self, folder: Folder, message: str, *, problem: bool) -> None:
        with self._cond:
            first = folder.error != message
            folder.error, folder.problem = message, problem
            if problem:  # what was queued is moot: the folder is caught up as a whole once it is back
                folder.pending.take()
            folder.retry_at = time.monotonic() + (HEALTH_SECONDS if problem else RETRY_SECONDS)
        if first:
            log.warning("watch: vault %s: folder %d: %s", folder.vault_id, folder.number, message)

    def _sync(self, folder: Folder, paths: set[str], subs: set[str]) -> None:
        live = self.app.vaults.live(folder.vault_id)
        if live is None or folder.closed:
            return
        try:
            live.acquire(touch=False)  # background work: auto-lock still sees the vault as idle
        except VaultLocked:
            return
        ctx = _SyncContext(self._stop, live.check)
        t0 = time.monotonic()
        try:
            with live.hold(VaultLock.INGEST, check=ctx.check_cancelled):  # one ingest at a time per vault, as `rag ingest`
                max_bytes = int(self.app.config.vault.max_document_mib * 1024 * 1024)
                result = sync(live.store, folder.watch, ctx, paths=paths, folders=subs, max_bytes=max_bytes, exclude=self._exclude)
        except FolderProblem as p:
            self._fail(folder, p.message, problem=True)
            return
        except (Cancelled, VaultLocked, KeyWiped):
            return  # locked or stopping: the next unlock catches up
        except MemoriesError as exc:
            self._requeue(folder, paths, subs)
            self._fail(folder, exc.message, problem=False)
            return
        finally:
            live.release(touch=False)
        now = time.monotonic()
        with self._cond:
            folder.error, folder.problem = None, False
            folder.last_sync = time.time()
            folder.syncs += 1
            folder.added += result.added
            folder.updated += result.updated
            folder.moved += result.moved
            folder.removed += result.removed
            folder.refused_count, folder.refused = result.refused_count, result.refused
            folder.skipped_outside = result.skipped_outside
            folder.notice = (
                f"the folder was found empty, so the {result.held} card(s) of its missing files were kept (an "
                "unmounted disk looks like an empty folder): if the notes are gone for good, delete the cards "
                "with `memories memory delete`"
                if result.held
                else None
            )
            for again in result.retry:
                folder.pending.add(now, path=again)
        if result.added or result.updated or result.moved:
            self.app.rag.background.request(folder.vault_id)
        if result.held:
            log.warning("watch: vault %s: folder %d was found empty: %d card(s) kept, not pruned", folder.vault_id, folder.number, result.held)
        if result.changed or result.refused_count:
            log.info(
                "watch: vault %s: folder %d synced: %d added, %d updated, %d moved, %d removed, %d refused (%.2f s)",
                folder.vault_id, folder.number, result.added, result.updated, result.moved, result.removed,
                result.refused_count, now - t0,
            )

    def _requeue(self, folder: Folder, paths: set[str], subs: set[str]) -> None:
        with self._cond:
            for p in paths:
                folder.pending.add(time.monotonic(), path=p)
            for s in subs:
                folder.pending.add(time.monotonic(), folder=s)

    def _health(self) -> None:
        """Folders gone or back, watchers that ended, and vaults unlocked without their watches yet."""
        if self._watches:
            self._reconcile()
        with self._cond:
            folders = [f for f in self._folders.values() if not f.running]
        for folder in folders:
            try:
                check_root(folder.watch.path)
            except FolderProblem as p:
                self._fail(folder, p.message, problem=True)
                continue
            watcher = folder.watcher
            if folder.problem or (watcher is not None and not watcher.alive()):
                # Back (or its watcher ended, e.g. it was replaced): watch it again and catch up.
                with self._cond:
                    folder.watcher, folder.needs_start, folder.problem, folder.retry_at = None, True, False, 0.0
                    self._cond.notify_all()
                if watcher is not None:
                    watcher.stop()

    def close(self) -> None:
        """Daemon shutdown: stop the worker (a running sync is cancelled) and every watcher."""
        self._stop.set()
        with self._cond:
            folders = list(self._folders.values())
            self._folders.clear()
            for folder in folders:
                folder.closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(10.0)
        for folder in folders:
            if folder.watcher is not None:
                folder.watcher.stop()


__all__ = ["WatchService", "Folder", "HEALTH_SECONDS"]
