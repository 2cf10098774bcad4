"""File system events of one watched folder (the ``watchdog`` library: inotify on Linux), coalesced.

:class:`FolderWatcher` runs one watchdog observer on a folder and turns its events into two kinds of
news: a file path that changed (created, written, closed after writing, deleted, or either end of a
move) or a folder to rescan (a folder created, moved or deleted, or events lost when the kernel
queue overflowed). Reads never count: open and close-without-write events are not even asked for,
so the daemon reading a file can never trigger another sync of it.

:class:`Pending` collects that news for a folder and says when it is ready: once no news came for
``quiet`` seconds (an editor's save storm is one sync), or at the latest ``max_wait`` seconds after
the first news, so a file written without pause is still synced now and then.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("memoriesd.watch")


class Pending:
    """Changed paths and folders to rescan of one folder, waiting for a quiet moment. Not thread-safe:
    the caller holds its own lock."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.folders: set[str] = set()
        self.first = 0.0
        self.last = 0.0

    def __bool__(self) -> bool:
        return bool(self.paths or self.folders)

    def add(self, now: float, path: str | None = None, folder: str | None = None) -> None:
        if not self:
            self.first = now
        self.last = now
        if path is not None:
            self.paths.add(path)
        if folder is not None:
            self.folders.add(folder)

    def due(self, quiet: float, max_wait: float) -> float | None:
        """The monotonic time at which the batch is ready (None when empty)."""
        if not self:
            return None
        return min(self.last + quiet, self.first + max_wait)

    def take(self) -> tuple[set[str], set[str]]:
        paths, folders = self.paths, self.folders
        self.paths, self.folders = set(), set()
        return paths, folders

    def count(self) -> int:
        return len(self.paths) + len(self.folders)


def _event_types() -> list[type[FileSystemEvent]]:
    from watchdog.events import (
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
        EventsLostEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
    )

    return [
        FileCreatedEvent,
        FileModifiedEvent,
        FileClosedEvent,
        FileDeletedEvent,
        FileMovedEvent,
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
        EventsLostEvent,
    ]


class FolderWatcher:
    """One watchdog observer on ``path``. ``on_path(p)`` / ``on_folder(p)`` are called from its thread."""

    def __init__(self, path: str, recursive: bool, on_path: Callable[[str], None], on_folder: Callable[[str], None]) -> None:
        self.path = path
        self.recursive = recursive
        self._on_path = on_path
        self._on_folder = on_folder
        self._observer: BaseObserver | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start watching; ``OSError`` when the folder is missing or the inotify limits are reached."""
        from watchdog.events import EventsLostEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                try:
                    watcher._dispatch(event, EventsLostEvent)
                except Exception:  # never let one odd event end the observer
                    log.exception("a file system event could not be handled")

        observer = Observer()
        observer.daemon = True
        observer.name = "memoriesd-watch"
        try:
            observer.schedule(Handler(), self.path, recursive=self.recursive, event_filter=_event_types())
            observer.start()
        except BaseException:
            self._stop_observer(observer)
            raise
        with self._lock:
            self._observer = observer

    def _dispatch(self, event: FileSystemEvent, lost: type) -> None:
        src = os.fsdecode(event.src_path) if event.src_path else ""
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if isinstance(event, lost):
            self._on_folder(self.path)
            return
        notify = self._on_folder if event.is_directory else self._on_path
        for p in (src, dest):
            if p:
                notify(p)

    def alive(self) -> bool:
        """False once the observer stopped by itself (the watched folder was deleted or moved away)."""
        with self._lock:
            observer = self._observer
        if observer is None or not observer.is_alive():
            return False
        return all(e.is_alive() for e in list(observer.emitters))

    def stop(self) -> None:
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            self._stop_observer(observer)

    @staticmethod
    def _stop_observer(observer: BaseObserver) -> None:
        try:
            observer.stop()
            if observer.is_alive():
                observer.join(5.0)
        except Exception:  # stopping must never fail a lock or a shutdown
            log.exception("stopping a folder watch failed")


__all__ = ["FolderWatcher", "Pending"]
