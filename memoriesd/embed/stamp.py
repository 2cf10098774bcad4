"""A cheap stamp of a model directory: notices added, removed and rewritten files without a walk.

The stamp is the size and mtime of every file (hidden files aside), as a full walk gives; but after
the first walk only the directories and the files it found are stat'ed. A file added, removed or
renamed changes its directory's mtime (then the directory is walked again); a file rewritten in
place changes its own size or mtime. A model directory holds a dozen files: a stamp costs a dozen
``stat`` calls, not a directory listing per search.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

#: ``(relative path, size, mtime_ns)`` of each file, sorted by path.
Stamp = tuple[tuple[str, int, int], ...]


def _dir_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class DirStamp:
    """The files of ``root`` with their sizes and mtimes (empty when ``root`` is not a directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        # Paths as strings, stat'ed with os.stat: pathlib's joins cost more than the stats.
        self._dirs: dict[str, tuple[int, int, int] | None] | None = None  # None: walk at the next call
        self._files: list[tuple[str, str]] = []  # (relative path, full path)

    def _walk(self) -> None:
        dirs: dict[str, tuple[int, int, int] | None] = {str(self.root): _dir_key(str(self.root))}
        files: list[tuple[str, str]] = []
        if self.root.is_dir():
            for p in sorted(self.root.rglob("*")):
                if p.is_dir():
                    dirs[str(p)] = _dir_key(str(p))
                elif p.is_file() and not p.name.startswith("."):
                    files.append((str(p.relative_to(self.root)), str(p)))
        self._dirs, self._files = dirs, files

    def current(self) -> Stamp:
        with self._lock:
            if self._dirs is None or any(_dir_key(d) != key for d, key in self._dirs.items()):
                self._walk()
            out = []
            for rel, full in self._files:
                try:
                    st = os.stat(full)
                except OSError:
                    self._dirs = None  # gone since the walk: its directory changed too; walk next time
                    continue
                out.append((rel, st.st_size, st.st_mtime_ns))
            return tuple(out)


__all__ = ["DirStamp", "Stamp"]
