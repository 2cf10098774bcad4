"""The one seam every durable write of a vault directory goes through.

Vault files (log, head, header, sealed snapshots and sidecars, recall counters, preserved files)
are written, fsynced, renamed and removed only through the functions below, which call the
current :class:`FileSystem` — the real one (:mod:`os`) unless a test installed another with
:func:`installed`. The reliability harness (``tests/support/``) installs one that records
every write, fsync and rename to rebuild what a power loss at each sync point could leave on
disk, or that fails a chosen step with ``ENOSPC``/``EIO``. Reads go straight to the file system:
what matters for durability is what was written and what was made durable.

Nothing here buffers or reorders: each helper is the system call it names (``write_all`` and
``pwrite_all`` loop over short writes).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PathLike = str | os.PathLike[str]


class FileSystem:
    """The real file system. A test subclass overrides methods to record or fail them."""

    def open(self, path: PathLike, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: PathLike, dst: PathLike) -> None:
        os.replace(src, dst)

    def unlink(self, path: PathLike) -> None:
        os.unlink(path)

    def fsync_dir(self, path: PathLike) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


REAL = FileSystem()
_current: FileSystem = REAL
_swap_lock = threading.Lock()


@contextmanager
def installed(fs: FileSystem) -> Iterator[FileSystem]:
    """Route every vault write through ``fs`` for the duration (tests and the reliability harness)."""
    global _current
    with _swap_lock:
        previous, _current = _current, fs
    try:
        yield fs
    finally:
        with _swap_lock:
            _current = previous


def current() -> FileSystem:
    return _current


def open_fd(path: PathLike, flags: int, mode: int = 0o600) -> int:
    return _current.open(path, flags, mode)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = _current.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = _current.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]
        offset += n


def fsync(fd: int) -> None:
    _current.fsync(fd)


def ftruncate(fd: int, length: int) -> None:
    _current.ftruncate(fd, length)


def close(fd: int) -> None:
    _current.close(fd)


def replace(src: PathLike, dst: PathLike) -> None:
    """``os.replace`` (also used where a plain rename is meant: the target never exists there)."""
    _current.replace(src, dst)


def unlink(path: PathLike, *, missing_ok: bool = False) -> None:
    try:
        _current.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def fsync_dir(path: PathLike) -> None:
    _current.fsync_dir(Path(path))


def truncate_file(path: PathLike, length: int) -> None:
    """Cut a file to ``length`` bytes and fsync it."""
    fd = open_fd(path, os.O_WRONLY)
    try:
        ftruncate(fd, length)
        fsync(fd)
    finally:
        close(fd)


def write_new(path: PathLike, data: bytes | bytearray | memoryview, *, mode: int = 0o600) -> None:
    """Create ``path`` (O_EXCL) holding ``data``, fsynced; removed again if any step fails."""
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        fsync(fd)
    except BaseException:
        close(fd)
        try:
            unlink(path, missing_ok=True)
        except OSError:
            pass
        raise
    close(fd)
