"""What every sync transport shares: the error, the listing entry, the protocol, the name rule.

Apart from :mod:`.transport` (which re-exports all of it, with the registry of transports) so that
each transport module imports these without importing its siblings: a new transport is one module
that implements :class:`Transport` plus one registration line in :mod:`.transport`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ..errors import SyncTargetError

#: The target cannot be read or written now (code ``sync_target``): one line, what and what to do.
TargetError = SyncTargetError

#: Longest name a transport accepts: the folder transport's temporary name adds 19 characters and a
#: file system allows 255 bytes.
MAX_NAME = 200

# Letters, digits and a few punctuation marks: enough for the engine's names (32 hex characters,
# ``memories-sync.json``) and for the foreign files a listing shows (``x.sync-conflict-...``,
# ``~syncthing~x.tmp``, ``.dropbox``, ``desktop.ini``); nothing that is a path separator, a glob, a
# shell or an option character at the start.
_NAME = re.compile(r"[A-Za-z0-9_.~+=@,][A-Za-z0-9_.~+=@,-]*")


@dataclass(frozen=True)
class Entry:
    """One plain file directly in a target's root."""

    name: str
    size: int  # bytes; -1 when the remote does not know


class Transport(Protocol):
    """How bytes reach one target. Names are file names directly in the target's root (no folders).

    Every method raises :class:`TargetError` when the target cannot be reached now; none retries.
    """

    scheme: str  # "folder" | "rclone"

    def describe(self) -> str:
        """The target as the user writes it: ``/abs/path`` or ``rclone:REMOTE:PATH``."""
        ...

    def list(self) -> list[Entry]:
        """Every plain file directly in the root, any name, sorted by name (the caller filters)."""
        ...

    def read(self, name: str) -> bytes | None:
        """The file's bytes; None when there is no such file."""
        ...

    def write(self, name: str, data: bytes) -> None:
        """Create or replace the file; readers of the target never see it half-written where the
        transport can avoid it (a folder: temporary name + fsync + rename; rclone: ``rcat``)."""
        ...

    def delete(self, name: str) -> None:
        """Remove the file; a file that is already gone is fine."""
        ...

    def ensure(self) -> None:
        """Create the root when it is missing (``sync add``, the first push)."""
        ...


def check_name(name: str) -> str:
    """``name`` when it is a plain file name a transport may use, else ValueError.

    Names come from the engine (or from a listing it filters), never straight from a user: a name
    outside the rule is a bug, and the rule is what keeps every transport inside its root.
    """
    if not (0 < len(name) <= MAX_NAME) or name in (".", "..") or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a file name a sync target accepts")
    return name
