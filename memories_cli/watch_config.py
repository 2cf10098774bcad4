"""The ``[[watch.folder]]`` tables of config.toml, edited for `memories rag watch` and `rag unwatch`.

A file of the old layout may still hold ``[[rag.watch]]`` tables (read for a release): a folder is
found in either, and a new one is always written as ``[[watch.folder]]``.

The file is edited with tomlkit, so the user's comments, key order and formatting stay as they
were. The new text is checked with the daemon's own parser before it replaces the file (atomically,
with the same permissions), so these commands never leave a config the daemon would refuse.
Concurrent edits by two commands are serialised with a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoriesd.errors import ConfigError, NotFound


@dataclass
class WatchEntry:
    vault_id: str
    vault_name: str
    path: str  # absolute
    recursive: bool = False
    include: list[str] = field(default_factory=list)
    prune: bool = False


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load(config_path: Path) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        text = config_path.read_text("utf-8") if config_path.exists() else ""
    except UnicodeDecodeError:
        raise ConfigError(f"config file {config_path} is not UTF-8 text: save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config file {config_path} cannot be read ({exc.strerror})") from None
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"config file {config_path} is not valid TOML ({exc}): fix the line it names") from None


#: (table, key) of the arrays of watch tables: the new one first, then the old spelling.
_ARRAYS = (("watch", "folder"), ("rag", "watch"))


def _array(doc: Any, table: str, key: str, config_path: Path) -> Any:
    """The ``table.key`` array of tables, or None."""
    from tomlkit.items import AoT

    parent = doc.get(table)
    watches = parent.get(key) if parent is not None and hasattr(parent, "get") else None
    if watches is not None and not isinstance(watches, AoT):
        raise ConfigError(
            f"config key {table}.{key} in {config_path} is not written as [[{table}.{key}]] tables: "
            "rewrite it as one [[watch.folder]] table per folder, then run the command again"
        )
    return watches


def _all_tables(doc: Any, config_path: Path) -> list[tuple[str, str, Any]]:
    """Every array of watch tables in the file, as (table, key, array)."""
    out = []
    for table, key in _ARRAYS:
        arr = _array(doc, table, key, config_path)
        if arr is not None:
            out.append((table, key, arr))
    return out


def _matches(table: Any, entry: WatchEntry, base: Path) -> bool:
    vault = str(table.get("vault", "")).strip()
    if vault not in (entry.vault_id, entry.vault_name) and vault.casefold() != entry.vault_name.casefold():
        return False
    raw = table.get("path")
    if not isinstance(raw, str) or not raw.strip():
        return False
    return os.path.normpath(base / Path(str(raw)).expanduser()) == os.path.normpath(entry.path)


def _new_table(entry: WatchEntry) -> Any:
    import tomlkit

    t = tomlkit.table()
    t.add("vault", entry.vault_id)
    if entry.vault_name and entry.vault_name != entry.vault_id:
        t["vault"].comment(entry.vault_name.replace("\n", " "))
    t.add("path", entry.path)
    t.add("recursive", entry.recursive)
    if entry.include:
        t.add("include", list(entry.include))
    t.add("prune", entry.prune)
    t.add(tomlkit.nl())
    return t


def _set_options(table: Any, entry: WatchEntry) -> bool:
    """Give an existing table the entry's options; True when something changed."""
    wanted: dict[str, Any] = {"recursive": entry.recursive, "include": list(entry.include), "prune": entry.prune}
    changed = False
    for key, value in wanted.items():
        current = table.get(key)
        current = list(current) if key == "include" and current is not None else current
        default: Any = [] if key == "include" else False
        if (current if current is not None else default) == value:
            continue
        if key == "include" and not value:
            del table[key]
        else:
            table[key] = value
        changed = True
    return changed


def _write(config_path: Path, text: str) -> None:
    """Replace the file atomically, keeping its permissions (0600 for a new file); through a symlink."""
    target = Path(os.path.realpath(config_path))
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _check(text: str, config_path: Path) -> None:
    from memoriesd.config import parse_config

    parse_config(tomllib.loads(text), config_path.parent.resolve(), str(config_path))


def set_watch(config_path: Path, lock_path: Path, entry: WatchEntry) -> str:
    """Add the folder's table or update its options: "added", "updated" or "unchanged"."""
    import tomlkit

    with _locked(lock_path):
        doc = _load(config_path)
        base = config_path.parent.resolve()
        arrays = _all_tables(doc, config_path)
        found = [t for _, _, arr in arrays for t in arr if _matches(t, entry, base)]
        if found:
            if not _set_options(found[0], entry):
                return "unchanged"
            change = "updated"
        else:
            watches = _array(doc, "watch", "folder", config_path)
            if watches is None:
                table = doc.get("watch")
                if table is None:
                    table = tomlkit.table(True)
                    doc.append("watch", table)
                watches = tomlkit.aot()
                watches.append(_new_table(entry))
                table.append("folder", watches)
            else:
                watches.append(_new_table(entry))
            change = "added"
        text = tomlkit.dumps(doc)
        _check(text, config_path)
        _write(config_path, text)
        return change


def remove_watch(config_path: Path, lock_path: Path, entry: WatchEntry) -> int:
    """Remove the folder's table(s) for the vault; how many. ``not_found`` when there is none."""
    with _locked(lock_path):
        doc = _load(config_path)
        base = config_path.parent.resolve()
        arrays = _all_tables(doc, config_path)
        count = sum(1 for _, _, arr in arrays for t in arr if _matches(t, entry, base))
        if not count:
            raise NotFound(
                f"{config_path} has no [[watch.folder]] table for {entry.path} and vault {entry.vault_name}: "
                f"`memories rag status {entry.vault_id}` lists the folders it watches"
            )
        for table, key, watches in arrays:
            for i in reversed([i for i, t in enumerate(watches) if _matches(t, entry, base)]):
                del watches[i]
            parent = doc[table]
            if len(watches) == 0:
                del parent[key]
                if len(parent) == 0 and parent.is_super_table():
                    del doc[table]
        text = doc.as_string()
        _check(text, config_path)
        _write(config_path, text)
        return count


__all__ = ["WatchEntry", "set_watch", "remove_watch"]
