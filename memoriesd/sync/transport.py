"""The seam between the sync engine and a target: a folder, or an rclone remote.

A transport moves opaque (already sealed) bytes under flat names; it knows nothing of segments.
:func:`parse_target` turns what the user typed into a transport through :data:`REGISTRY`
(scheme prefix -> factory); anything else that is an absolute path (or ``~/...``) is a folder.

The folder transport is what every folder-sync tool (Syncthing, Dropbox, iCloud Drive, Nextcloud)
sees: each file is written under a temporary name that starts with ``.`` (which those tools skip or
sync as a separate file, and which the engine never takes for one of its names), flushed to disk,
then renamed over its real name, so a half-written file never shows under a complete name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from ..config import Config, SyncConfig
from ..errors import UsageError
from .base import Entry, TargetError, Transport, check_name
from .rclone import RcloneTransport

__all__ = [
    "REGISTRY",
    "Entry",
    "Factory",
    "FolderTransport",
    "RcloneTransport",
    "TargetError",
    "Transport",
    "parse_target",
]

#: Makes a transport from the text after its scheme prefix and the ``[sync]`` settings.
Factory = Callable[[str, SyncConfig], Transport]

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class FolderTransport:
    """A folder on this machine (which a folder-sync tool may share). Files 0600, the root 0700."""

    scheme = "folder"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root).expanduser()
        if not path.is_absolute():
            raise UsageError(f"the sync folder {root} is not an absolute path: write it as /path or ~/path")
        self.root = Path(os.path.normpath(path))

    def describe(self) -> str:
        return str(self.root)

    # -- errors ---------------------------------------------------------------------------------

    def _missing(self) -> TargetError:
        return TargetError(
            f"the sync folder {self.root} is missing: is the drive mounted? Sync resumes once it is back "
            "(`memories sync remove` drops the target)"
        )

    def _error(self, action: str, exc: OSError) -> TargetError:
        """One line for an OS error while ``action`` (a verb phrase) in the folder."""
        if exc.errno == errno.ENOENT and not self.root.exists():
            return self._missing()
        if exc.errno in (errno.EACCES, errno.EPERM):
            what = "permission denied: make the folder yours and writable (chmod 700)"
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
            what = "the drive is full: free space there"
        elif exc.errno == errno.EROFS:
            what = "the drive is mounted read-only: mount it writable"
        elif exc.errno == errno.ENOTDIR:
            what = "it is not a folder: name a folder"
        else:
            what = f"{exc.strerror or exc.__class__.__name__}: check the drive"
        return TargetError(f"cannot {action} the sync folder {self.root} ({what})")

    def _check_root(self) -> None:
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            raise self._missing() from None
        except OSError as exc:
            raise self._error("reach", exc) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise TargetError(
                f"the sync folder {self.root} is not a folder: name a folder, or move that file away"
            )

    def _fsync_dir(self) -> None:
        """Make a rename or unlink durable (a power loss after it must not bring the old name back)."""
        fd = os.open(self.root, os.O_RDONLY | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the protocol ---------------------------------------------------------------------------

    def list(self) -> list[Entry]:
        out: list[Entry] = []
        try:
            with os.scandir(self.root) as it:
                for e in it:
                    try:
                        if e.is_file(follow_symlinks=False):
                            out.append(Entry(e.name, e.stat(follow_symlinks=False).st_size))
                    except FileNotFoundError:  # renamed or deleted while listed: not there any more
                        continue
        except FileNotFoundError:
            raise self._missing() from None
        except OSError as exc:
            raise self._error("list", exc) from exc
        out.sort(key=lambda e: e.name)
        return out

    def read(self, name: str) -> bytes | None:
        path = self.root / check_name(name)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except FileNotFoundError:
            self._check_root()  # a missing drive is not a missing file
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symbolic link: not a plain file of the target
                return None
            raise self._error("read from", exc) from exc
        try:
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                return f.read()
        except OSError as exc:
            raise self._error("read from", exc) from exc

    def write(self, name: str, data: bytes) -> None:
        final = self.root / check_name(name)
        self._check_root()  # never recreate a folder whose drive is gone: that would fork the target
        tmp = self.root / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self._error("write to", exc) from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            self._fsync_dir()
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._error("write to", exc) from exc

    def delete(self, name: str) -> None:
        path = self.root / check_name(name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            self._check_root()
            return
        except OSError as exc:
            raise self._error("delete from", exc) from exc
        try:
            self._fsync_dir()
        except OSError as exc:
            raise self._error("delete from", exc) from exc

    def ensure(self) -> None:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # a file under that name
            pass
        except OSError as exc:
            raise self._error("create", exc) from exc
        self._check_root()


def _rclone(rest: str, cfg: SyncConfig) -> Transport:
    return RcloneTransport(
        rest,
        program=cfg.rclone_program,
        config_file=cfg.rclone_config or None,
        timeout=cfg.rclone_timeout_seconds,
    )


#: Scheme prefix -> factory. A new transport: its module, and one line here.
REGISTRY: dict[str, Factory] = {
    "rclone:": _rclone,
}

_USAGE = "write an absolute folder path (/path or ~/path) or rclone:REMOTE:PATH (a remote of `rclone config`)"


def parse_target(
    text: str,
    *,
    config: Config | SyncConfig | None = None,
    rclone_program: str | None = None,
    rclone_config: str | None = None,
) -> Transport:
    """The transport of a target as the user wrote it; :class:`UsageError` when it is neither form.

    ``config`` gives the ``[sync]`` settings (defaults when None); ``rclone_program`` and
    ``rclone_config`` override them (tests, ``memories vault join`` before a config exists).
    """
    cfg = config.sync if isinstance(config, Config) else (config or SyncConfig())
    if rclone_program is not None:
        cfg = SyncConfig(rclone_program, cfg.rclone_config, cfg.rclone_timeout_seconds)
    if rclone_config is not None:
        cfg = SyncConfig(cfg.rclone_program, rclone_config, cfg.rclone_timeout_seconds)
    target = text.strip()
    if not target or "\x00" in target:
        raise UsageError(f"the sync target is empty: {_USAGE}")
    for prefix, factory in REGISTRY.items():
        if target.startswith(prefix):
            return factory(target[len(prefix) :], cfg)
    if target.startswith(("/", "~")):
        return FolderTransport(target)
    raise UsageError(f"the sync target {target} is not understood: {_USAGE}")
