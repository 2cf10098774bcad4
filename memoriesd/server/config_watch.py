"""Notice an edited ``config.toml`` while the daemon runs (it applies only at start).

The daemon reads ``config.toml`` once. A person who edits it afterwards used to see the old
behaviour (or the old error) with no hint why. :class:`ConfigWatch` takes a fingerprint of the
file when the daemon starts and compares at each request: one ``stat`` (size, mtime, inode); only
when that moved is the file read and hashed, so saving the same bytes again (or touching it) is
not a change, nor is an edit of the ``[[watch.folder]]`` tables (applied live). While the content
differs, every reply carries :func:`restart_notice`.

Per request rather than a watcher thread: a ``stat`` costs microseconds, and the answer is needed
exactly when a reply is sent (never between requests).

An edit that leaves the file invalid is said at once, with the reason and the closest valid key
(issue 29: the old notice sent people to a restart that stopped the daemon and then failed on the
file). The file is validated by the daemon's own parser whenever its ``stat`` moves, watch tables
included: `memories daemon restart` would refuse it whatever part is broken.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..config import Config, load_config, read_config
from ..errors import ConfigError
from ..home import Home

log = logging.getLogger(__name__)

_Stat = tuple[int, int, int] | None  # (size, mtime_ns, inode), None when the file is absent
#: The table the daemon applies without a restart (`rag watch` / `rag unwatch` reload it), and its
#: keys' old spellings under [rag], still read for a release.
LIVE_TABLE = "watch"
LIVE_RAG_KEYS = frozenset({"watch", "watch_debounce_seconds"})
#: In the home's run directory: the bytes of config.toml the daemon started with, for its vault processes.
STARTED_COPY = "config.started.toml"


@dataclass(frozen=True)
class Started:
    """config.toml as the daemon read it at start: its bytes, None when there was no file."""

    raw: bytes | None


def restart_notice(path: Path) -> str:
    return (
        f"config.toml ({path}) changed since the daemon started: run `memories daemon restart` to apply it; "
        "unlocked vaults will lock"
    )


def invalid_notice(path: Path, why: str) -> str:
    """One line: the edited file is invalid, why (with "did you mean"), and that nothing stopped."""
    return (
        f"config.toml ({path}) was edited and is invalid: {sentence(why)} memoriesd keeps running with the settings "
        "it started with: fix the file, then run `memories daemon restart`"
    )


def sentence(text: str) -> str:
    """``text`` ending as a sentence (a message may end in "?" or in a parenthesis)."""
    return text if text.endswith((".", "?", "!")) else text + "."


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

    def __init__(self, path: Path, started: Started | None = None) -> None:
        """``started``: what the daemon started with, for a vault process that starts later (its
        replies must say what the daemon's say); None = the file as it is now (the daemon itself)."""
        self.path = path
        self._lock = threading.Lock()
        self._stat = self._stat_now()
        raw = self._read()
        self.started = Started(raw) if started is None else started
        self._start_digest = self._digest(self.started.raw)
        self._changed = self._digest(raw) != self._start_digest
        self._problem: str | None = self._validate(raw)  # why the file is invalid now (checked when its stat moves)

    def _stat_now(self) -> _Stat:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def _digest(self, raw: bytes | None) -> bytes | None:
        """The settings that apply only at start: the ``[[watch.folder]]`` tables and their debounce are
        left out, since `rag watch`/`unwatch` apply them live (``rag.watch_reload``)."""
        if raw is None:
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
            raw = self._read()
            self._changed = self._digest(raw) != self._start_digest
            self._problem = self._validate(raw)
            return self._changed

    def _validate(self, raw: bytes | None) -> str | None:
        if raw is None:
            return None  # absent: every setting has its default
        try:
            read_config(raw, self.path)
        except ConfigError as exc:
            return exc.message
        return None

    def problem(self) -> str | None:
        """Why the file as it is now is invalid (the key, the closest valid key), or None."""
        self.changed()
        with self._lock:
            return self._problem

    def notices(self) -> list[str]:
        changed = self.changed()
        with self._lock:
            problem = self._problem
        if problem is not None:
            return [invalid_notice(self.path, problem)]
        return [restart_notice(self.path)] if changed else []


def keep_started(home: Home, watch: ConfigWatch) -> None:
    """Leave the bytes the daemon started with in its run directory (0600; none when there was no
    file), so a vault process it starts after an edit has the daemon's settings, not the edit's error."""
    copy = home.run / STARTED_COPY
    with contextlib.suppress(FileNotFoundError):
        copy.unlink()
    if watch.started.raw is None:
        return
    try:
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(watch.started.raw)
    except OSError as exc:
        log.warning("config.toml: no copy of the settings at start was kept in %s (%s)", home.run, exc.strerror)


def started_of(home: Home) -> Started:
    """What the running daemon started with (see :func:`keep_started`)."""
    try:
        return Started((home.run / STARTED_COPY).read_bytes())
    except FileNotFoundError:
        return Started(None)


def load_started_config(home: Home, started: Started) -> Config:
    """A vault process's settings: config.toml as it is now (a valid edit applies, as before), else,
    when an edit left it invalid, the file the daemon started with: the daemon keeps running on those,
    and so must every vault it unlocks (a broken edit used to fail each unlock with ``internal``)."""
    try:
        return load_config(home.config_path)
    except ConfigError as exc:
        log.warning("%s; this vault process uses the settings memoriesd started with", exc.message)
        return read_config(started.raw, home.config_path) if started.raw is not None else Config()


__all__ = ["ConfigWatch", "Started", "keep_started", "load_started_config", "started_of", "invalid_notice", "sentence", "name_config_path", "restart_notice"]
