"""What unlock does with files a vault directory should not hold: nothing is deleted that could
still be data.

Bytes and logs the head does not explain are kept aside as ``preserved-*`` files (ciphertext,
never loaded); only what is provably redundant (temp files that never renamed, logs of an older
epoch than the head's) is removed. Called from :meth:`VaultStore._load`, which runs only while a
vault is being unlocked under its gate (nothing else has it open).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from . import fsio
from .format import PRESERVED_PREFIX, atomic_write, fsync_dir

log = logging.getLogger("memoriesd.vault")

_LOG_FILE = re.compile(r"log-(\d{8,})\.bin")


def _names(vault_dir: Path, name: str) -> Iterator[Path]:
    """``name``, then ``stem-2.ext``, ``stem-3.ext``...: a preserved file never replaces another."""
    stem, dot, ext = name.rpartition(".")
    yield vault_dir / name
    for n in itertools.count(2):
        yield vault_dir / f"{stem}-{n}{dot}{ext}"


def free_name(vault_dir: Path, name: str) -> Path:
    return next(p for p in _names(vault_dir, name) if not os.path.lexists(p))


def preserve_bytes(vault_dir: Path, name: str, data: bytes) -> str:
    """Keep ``data`` (ciphertext) durably in a preserved file; returns its name."""
    for candidate in _names(vault_dir, name):
        if not os.path.lexists(candidate):
            atomic_write(candidate, data)
            return candidate.name
        if candidate.is_file() and candidate.read_bytes() == data:
            return candidate.name  # kept by an earlier unlock that stopped before cutting the log
    raise AssertionError("unreachable")  # pragma: no cover


def clean_leftovers(vault_dir: Path, vault_id: str, head_epoch: int) -> None:
    """Remove what is provably redundant; preserve a log the head does not explain.

    - ``.*.tmp``: temp files of atomic writes that never renamed (the target is intact).
    - a log of an OLDER epoch than the head's: removed. The head names a newer log, and a
      head can only name a log once that log was written and fsynced in full (compaction
      writes the whole new log first), so the older log is a finished compaction's input.
    - a log of a NEWER epoch than the head's: never removed. It is normally an interrupted
      compaction (a copy of what the current log holds), but it can also be the real vault
      beside an older head.bin and log that were put back (a rollback or a partial restore),
      and from the files alone the two cannot be told apart without trusting a comparison
      with the loaded state. Keeping it costs only disk space, so it is renamed to
      ``preserved-log-<epoch>.bin`` (out of the way of the next compaction, never loaded)
      and the daemon log says so. ``preserved-*`` files and ``unlock-failures`` are never
      touched here.
    """
    changed = False
    for p in sorted(vault_dir.iterdir()):
        name = p.name
        if name.startswith(".") and name.endswith(".tmp"):
            log.warning("vault %s: removed a temp file of an interrupted write", vault_id)
            fsio.unlink(p, missing_ok=True)
            changed = True
            continue
        m = _LOG_FILE.fullmatch(name)
        if m is None or int(m.group(1)) == head_epoch:
            continue
        epoch = int(m.group(1))
        if epoch < head_epoch:
            log.warning("vault %s: removed the log of epoch %d (replaced by a compaction)", vault_id, epoch)
            fsio.unlink(p, missing_ok=True)
        else:
            target = free_name(vault_dir, f"{PRESERVED_PREFIX}{name}")
            fsio.replace(p, target)  # target is a free name: a rename
            log.warning(
                "vault %s: kept a log of epoch %d, newer than the head's (epoch %d), as %s; it was "
                "not loaded (an interrupted compaction, or an older head.bin put back)",
                vault_id,
                epoch,
                head_epoch,
                target.name,
            )
        changed = True
    if changed:
        fsync_dir(vault_dir)
