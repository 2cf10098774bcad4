"""Notice an edited ``config.toml`` while the daemon runs (it applies only at start).

The daemon reads ``config.toml`` once. A person who edits it afterwards used to see the old
behaviour (or the old error) with no hint why. :class:`ConfigWatch` takes a fingerprint of the
file when the daemon starts and compares at each request: one ``stat`` (size, mtime, inode); only
when that moved is the file read and hashed, so saving the same bytes again (or touching it) is
not a change, nor is an edit of the ``[[watch.folder]]`` tables (applied live). While the content
differs, every reply carries :func:`restart_notice`.

Per request rather than a watcher thread: a ``stat`` costs microseconds, and the answer is needed
exactly when a reply is sent (never between requests).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import tomllib
from pathlib import Path

_Stat = tuple[int, int, int] | None  # (size, mtime_ns, inode), None when the file is absent
#: The table the daemon applies without a restart (`rag watch` / `rag unwatch` reload it), and its
#: keys' old spellings under [rag], still read for a release.
LIVE_TABLE = "watch"
LIVE_RAG_KEYS = frozenset({"watch", "watch_debounce_seconds"})


def restart_notice(path: Path) -> str:
    return (
        f"config.toml ({path}) changed since the daemon started: run `memories daemon restart` to apply it; "
        "unlocked vaults will lock"
    )


def name_config_path(message: str, path: Path, code: str = "") -> str:
    """A message that points at ``config.toml`` names its full path, and how to apply an edit.

    Errors raised deep in the daemon say "config.toml" (or, for ``config_invalid``, only a key);
    which file that is (the home may be any directory) and that an edit needs a restart are said
    here, in one place.
    """
    full = str(path)
    if full not in message:
        if "config.toml" in message:
            message = message.replace("config.toml", full, 1)
            if "restart" not in message:
                message += " and run `memories daemon restart`"
        elif code == "config_invalid":
            message += f" (config file {full}; then run `memories daemon restart`)"
    return message.replace("restart the daemon", "run `memories daemon restart`")


class ConfigWatch:
    """Whether ``path`` differs from what it held when the daemon started (thread-safe, cheap)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stat = self._stat_now()
        self._start_digest = self._digest()
        self._changed = False

    def _stat_now(self) -> _Stat:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def _digest(self) -> bytes | None:
        """The settings that apply only at start: the ``[[watch.folder]]`` tables and their debounce are
        left out, since `rag watch`/`unwatch` apply them live (``rag.watch_reload``)."""
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            return hashlib.sha256(b"raw\0" + raw).digest()  # broken: differs from any file that parses
        data.pop(LIVE_TABLE, None)
        rag = data.get("rag")
        if isinstance(rag, dict):
            rest = {k: v for k, v in rag.items() if k not in LIVE_RAG_KEYS}
            if rest:
                data["rag"] = rest
            else:  # a [rag] table holding only watches reads as no [rag] table
                del data["rag"]
        canonical = json.dumps(data, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).digest()

    def changed(self) -> bool:
        """True while the file's bytes differ from those at start (absent counts as content)."""
        now = self._stat_now()
        with self._lock:
            if now == self._stat:
                return self._changed
            self._stat = now
            self._changed = self._digest() != self._start_digest
            return self._changed

    def notices(self) -> list[str]:
        return [restart_notice(self.path)] if self.changed() else []


__all__ = ["ConfigWatch", "name_config_path", "restart_notice"]
