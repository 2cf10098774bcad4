"""A recording file system for :mod:`memoriesd.vault.fsio`, and a model of what a power loss leaves.

:class:`RecordingFS` performs every write for real (so the code under test runs unchanged) and
records, for one directory (a vault directory), each create, write, truncate, fsync, rename,
unlink and directory fsync, with the bytes written. :class:`DiskModel` replays that trace and, at
any point, builds what the disk may hold after a power loss there:

- file data made durable by an ``fsync`` of that file is kept;
- each write or truncate since the file's last ``fsync`` is, independently (a seeded RNG):
  applied, dropped, torn (a prefix, or a random subset of its 512-byte sectors) or garbled
  (applied, then a sector-sized piece overwritten with random bytes);
- directory operations (create, rename, unlink) are durable once the directory is fsynced; of
  the ones since, a random *prefix* survives (journaling file systems keep metadata in order).

Seed 0 of every point applies everything, seed 1 nothing pending; the others are random.
:class:`FailingFS` fails a chosen step with ``ENOSPC`` or ``EIO`` instead.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

from memoriesd.vault import fsio

SECTOR = 512
SYNC_KINDS = ("fsync", "rename", "fsync_dir")


@dataclass(frozen=True)
class Op:
    kind: str  # create | write | trunc | fsync | rename | unlink | fsync_dir | ack
    ino: int = -1
    name: str = ""
    dst: str = ""
    offset: int = 0
    data: bytes = b""
    label: str = ""


class _Scoped(fsio.FileSystem):
    """Knows which paths lie directly in the watched directory."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)

    def rel(self, path: fsio.PathLike) -> str | None:
        parent, name = os.path.split(os.path.abspath(os.fspath(path)))
        return name if os.path.realpath(parent) == self.root else None


class RecordingFS(_Scoped):
    """Performs every operation and records the ones on files directly in ``root``.

    ``real_sync=False`` skips the real fsyncs (the trace says where they were; the harness's
    durability is the model's, not the disk's).
    """

    def __init__(self, root: Path, *, real_sync: bool = False) -> None:
        super().__init__(root)
        self.real_sync = real_sync
        self.lock = threading.RLock()
        self.ops: list[Op] = []
        self.names: dict[str, int] = {}
        self.baseline: dict[int, bytes] = {}
        self.fds: dict[int, int] = {}
        self._ino = 0
        for p in sorted(Path(self.root).iterdir()):
            if p.is_file():
                ino = self._new()
                self.names[p.name] = ino
                self.baseline[ino] = p.read_bytes()
        self.baseline_names = dict(self.names)

    def _new(self) -> int:
        self._ino += 1
        return self._ino

    def ack(self, label: str) -> int:
        """Mark an acknowledged state in the trace; returns its position."""
        with self.lock:
            self.ops.append(Op("ack", label=label))
            return len(self.ops) - 1

    def open(self, path: fsio.PathLike, flags: int, mode: int = 0o600) -> int:
        name = self.rel(path)
        with self.lock:
            fd = super().open(path, flags, mode)
            if name is None:
                return fd
            ino = self.names.get(name)
            if ino is None:
                ino = self._new()
                self.names[name] = ino
                self.ops.append(Op("create", ino, name))
            elif flags & os.O_TRUNC:
                self.ops.append(Op("trunc", ino, offset=0))
            self.fds[fd] = ino
            return fd

    def write(self, fd: int, data: memoryview) -> int:
        with self.lock:
            ino = self.fds.get(fd)
            off = os.lseek(fd, 0, os.SEEK_CUR) if ino is not None else 0
            n = super().write(fd, data)
            if ino is not None and n > 0:
                self.ops.append(Op("write", ino, offset=off, data=bytes(data[:n])))
            return n

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        with self.lock:
            n = super().pwrite(fd, data, offset)
            ino = self.fds.get(fd)
            if ino is not None and n > 0:
                self.ops.append(Op("write", ino, offset=offset, data=bytes(data[:n])))
            return n

    def fsync(self, fd: int) -> None:
        with self.lock:
            ino = self.fds.get(fd)
            if ino is None or self.real_sync:
                super().fsync(fd)
            if ino is not None:
                self.ops.append(Op("fsync", ino))

    def ftruncate(self, fd: int, length: int) -> None:
        with self.lock:
            super().ftruncate(fd, length)
            ino = self.fds.get(fd)
            if ino is not None:
                self.ops.append(Op("trunc", ino, offset=length))

    def close(self, fd: int) -> None:
        with self.lock:
            self.fds.pop(fd, None)
            super().close(fd)

    def replace(self, src: fsio.PathLike, dst: fsio.PathLike) -> None:
        s, d = self.rel(src), self.rel(dst)
        with self.lock:
            super().replace(src, dst)
            if s is None and d is None:
                return
            if s is None or d is None:
                raise AssertionError(f"a rename into or out of the recorded directory: {src} -> {dst}")
            self.names[d] = self.names.pop(s)
            self.ops.append(Op("rename", name=s, dst=d))

    def unlink(self, path: fsio.PathLike) -> None:
        name = self.rel(path)
        with self.lock:
            super().unlink(path)
            if name is not None:
                self.names.pop(name, None)
                self.ops.append(Op("unlink", name=name))

    def fsync_dir(self, path: fsio.PathLike) -> None:
        with self.lock:
            mine = os.path.realpath(path) == self.root
            if not mine or self.real_sync:
                super().fsync_dir(path)
            if mine:
                self.ops.append(Op("fsync_dir"))


def _write(content: bytearray, offset: int, data: bytes) -> None:
    end = offset + len(data)
    if len(content) < offset:
        content.extend(bytes(offset - len(content)))
    content[offset:end] = data


def _apply(content: bytearray, op: Op) -> None:
    if op.kind == "write":
        _write(content, op.offset, op.data)
    elif op.kind == "trunc":
        if op.offset < len(content):
            del content[op.offset :]
        else:
            content.extend(bytes(op.offset - len(content)))


def _apply_dir(names: dict[str, int], ops: list[Op]) -> dict[str, int]:
    for op in ops:
        if op.kind == "create":
            names[op.name] = op.ino
        elif op.kind == "rename":
            if op.name in names:
                names[op.dst] = names.pop(op.name)
        elif op.kind == "unlink":
            names.pop(op.name, None)
    return names


def _pieces(op: Op) -> list[tuple[int, int]]:
    """The write's byte ranges (relative to its data) cut at absolute sector boundaries."""
    out = []
    pos = 0
    while pos < len(op.data):
        abs_pos = op.offset + pos
        n = min(SECTOR - abs_pos % SECTOR, len(op.data) - pos)
        out.append((pos, pos + n))
        pos += n
    return out


def _lossy(content: bytearray, op: Op, rng: random.Random) -> str:
    """Apply one unsynced operation as a power loss may leave it; returns what was done."""
    if op.kind == "trunc":
        if rng.random() < 0.5:
            _apply(content, op)
            return "applied"
        return "dropped"
    r = rng.random()
    if r < 0.3:
        _write(content, op.offset, op.data)
        return "applied"
    if r < 0.55:
        return "dropped"
    pieces = _pieces(op)
    if r < 0.85:
        if rng.random() < 0.5:  # a prefix
            keep = pieces[: rng.randrange(len(pieces) + 1)]
        else:  # any subset of its sectors
            keep = [p for p in pieces if rng.random() < 0.5]
        for a, b in keep:
            _write(content, op.offset + a, op.data[a:b])
        return "torn"
    _write(content, op.offset, op.data)
    a, b = rng.choice(pieces)
    _write(content, op.offset + a, rng.randbytes(b - a))
    return "garbled"


@dataclass
class DiskModel:
    """Replays a :class:`RecordingFS` trace; :meth:`crash` builds a post-power-loss directory."""

    baseline_names: dict[str, int]
    baseline: dict[int, bytes]
    dnames: dict[str, int] = field(init=False)
    pdir: list[Op] = field(init=False, default_factory=list)
    ddata: dict[int, bytes] = field(init=False)
    pdata: dict[int, list[Op]] = field(init=False, default_factory=dict)
    vnames: dict[str, int] = field(init=False)
    vdata: dict[int, bytearray] = field(init=False)
    versions: dict[str, set[bytes]] = field(init=False)

    def __post_init__(self) -> None:
        self.dnames = dict(self.baseline_names)
        self.ddata = dict(self.baseline)
        self.vnames = dict(self.baseline_names)
        self.vdata = {i: bytearray(b) for i, b in self.baseline.items()}
        self.versions = {n: {self.baseline[i]} for n, i in self.baseline_names.items()}

    @classmethod
    def of(cls, fs: RecordingFS) -> DiskModel:
        return cls(dict(fs.baseline_names), dict(fs.baseline))

    def step(self, op: Op) -> None:
        k = op.kind
        if k == "create":
            self.pdir.append(op)
            self.vnames[op.name] = op.ino
            self.vdata[op.ino] = bytearray()
            self.ddata.setdefault(op.ino, b"")
        elif k in ("write", "trunc"):
            self.pdata.setdefault(op.ino, []).append(op)
            _apply(self.vdata[op.ino], op)
        elif k == "fsync":
            content = bytearray(self.ddata.get(op.ino, b""))
            for p in self.pdata.pop(op.ino, []):
                _apply(content, p)
            self.ddata[op.ino] = bytes(content)
        elif k == "rename":
            ino = self.vnames.pop(op.name)
            self.vnames[op.dst] = ino
            self.versions.setdefault(op.dst, set()).add(bytes(self.vdata[ino]))
            self.pdir.append(op)
        elif k == "unlink":
            self.vnames.pop(op.name, None)
            self.pdir.append(op)
        elif k == "fsync_dir":
            self.dnames = _apply_dir(self.dnames, self.pdir)
            self.pdir = []

    def volatile(self) -> dict[str, bytes]:
        """The directory as the running process sees it (everything applied)."""
        return {n: bytes(self.vdata[i]) for n, i in self.vnames.items()}

    def pending(self) -> int:
        return len(self.pdir) + sum(len(v) for v in self.pdata.values())

    def crash(self, seed: int, rng: random.Random) -> dict[str, bytes]:
        """One possible disk after a power loss now: seed 0 keeps everything, seed 1 nothing pending."""
        if seed == 0:
            keep_dir = len(self.pdir)
        elif seed == 1:
            keep_dir = 0
        else:
            keep_dir = rng.randrange(len(self.pdir) + 1)
        names = _apply_dir(dict(self.dnames), self.pdir[:keep_dir])
        out: dict[str, bytes] = {}
        for name, ino in names.items():
            content = bytearray(self.ddata.get(ino, b""))
            for op in self.pdata.get(ino, []):
                if seed == 0:
                    _apply(content, op)
                elif seed != 1:
                    _lossy(content, op, rng)
            out[name] = bytes(content)
        return out


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def write_dir(path: Path, files: dict[str, bytes]) -> None:
    path.mkdir(mode=0o700, parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
        os.chmod(path / name, 0o600)


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------- error injection

#: The steps a :class:`FailingFS` can fail, and the errors that make sense there.
STEP_KINDS = ("create", "write", "fsync", "trunc", "rename", "unlink", "fsync_dir")


class FailingFS(_Scoped):
    """Counts the write steps on files directly in ``root`` and fails step number ``fail_at``.

    ``ENOSPC`` stays: once it struck, every later step that needs space (create, write) fails
    too, as on a full disk. ``EIO`` strikes once. ``fail_at=None`` only counts (and records the
    kinds of) the steps.
    """

    def __init__(self, root: Path, fail_at: int | None, err: int) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.err = err
        self.steps: list[str] = []
        self.failed: tuple[int, str] | None = None
        self.fd_names: dict[int, str] = {}
        self.lock = threading.RLock()

    def _step(self, kind: str, path: fsio.PathLike | None) -> None:
        with self.lock:
            if path is None or self.rel(path) is None:
                return
            n = len(self.steps)
            self.steps.append(kind)
            sticky = self.failed is not None and self.err == errno.ENOSPC and kind in ("create", "write")
            if n == self.fail_at or sticky:
                if self.failed is None:
                    self.failed = (n, kind)
                raise OSError(self.err, os.strerror(self.err))

    def _fd_path(self, fd: int) -> str | None:
        return self.fd_names.get(fd)

    def open(self, path: fsio.PathLike, flags: int, mode: int = 0o600) -> int:
        if flags & os.O_CREAT and not os.path.exists(path):
            self._step("create", path)
        fd = super().open(path, flags, mode)
        if self.rel(path) is not None:
            self.fd_names[fd] = os.fspath(path)
        return fd

    def write(self, fd: int, data: memoryview) -> int:
        self._step("write", self._fd_path(fd))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        self._step("write", self._fd_path(fd))
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._step("fsync", self._fd_path(fd))
        super().fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._step("trunc", self._fd_path(fd))
        super().ftruncate(fd, length)

    def close(self, fd: int) -> None:
        self.fd_names.pop(fd, None)
        super().close(fd)

    def replace(self, src: fsio.PathLike, dst: fsio.PathLike) -> None:
        self._step("rename", dst)
        super().replace(src, dst)

    def unlink(self, path: fsio.PathLike) -> None:
        self._step("unlink", path)
        super().unlink(path)

    def fsync_dir(self, path: fsio.PathLike) -> None:
        if os.path.realpath(path) == self.root:
            self._step("fsync_dir", Path(path) / "x")
        super().fsync_dir(path)
