"""Vault names and ids read from ``header.json`` only when the file changed.

Every request names its vault, and resolving a name lists the vaults: without this cache each
request parsed every vault's header. A header is read again when its ``stat`` (inode, size, mtime,
ctime) differs from the last read: a rename (``vault rename``, a key change's atomic replace) gives
a new inode, an edit in place a new mtime and ctime.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from .format import HEADER_NAME
from .store import public_header

_Key = tuple[int, int, int, int]


class HeaderCache:
    """:func:`memoriesd.vault.store.public_header` of each vault directory, cached by stat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[_Key, dict[str, Any] | None]] = {}  # by directory path

    def public(self, vault_dir: Path) -> dict[str, Any] | None:
        """The vault's ``{"vault_id", "name"}`` (a fresh dict), or None when unreadable or absent."""
        where = os.fspath(vault_dir)
        try:
            st = os.stat(os.path.join(where, HEADER_NAME))  # os.path, not pathlib: this runs per vault per request
        except OSError:
            with self._lock:
                self._items.pop(where, None)
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            hit = self._items.get(where)
        if hit is not None and hit[0] == key:
            info = hit[1]
        else:
            info = public_header(vault_dir)
            with self._lock:
                self._items[where] = (key, info)
        return dict(info) if info is not None else None


__all__ = ["HeaderCache"]
