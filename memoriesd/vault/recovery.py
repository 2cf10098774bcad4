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
from .format import HEAD_NAME, PRESERVED_PREFIX, atomic_write, fsync_dir

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


# ----------------------------------------------------------------------------- key change (rekey)

#: Prefix of the files a key change (``vault passwd --rekey``) writes beside the vault, sealed
#: under the new key, before ``header.json`` switches to that key (docs/format.md, "Key change").
REKEY_PREFIX = "rekey-"
#: The staged head: it opens under the key ``header.json`` wraps exactly when the switch happened.
REKEY_HEAD = REKEY_PREFIX + HEAD_NAME
#: The sealed derived files of a vault (under subkeys of the vault key). Once a key change has
#: switched, those left of the old key are removed (their staged replacements take their place).
DERIVED_FILES = ("lexical-index.bin", "vector-spaces.bin", "recalls.bin", "vectors-*.bin", "sync-state.bin")


def staged_files(vault_dir: Path) -> list[Path]:
    """The files a key change staged (``rekey-*``), the head last."""
    found = [p for p in vault_dir.iterdir() if p.name.startswith(REKEY_PREFIX)]
    return sorted(found, key=lambda p: (p.name == REKEY_HEAD, p.name))


def discard_rekey(vault_dir: Path, vault_id: str) -> None:
    """Remove the staged files of a key change that never switched: they are sealed under a key
    that no header wraps (the one the change made), so nothing can ever read them."""
    files = staged_files(vault_dir)
    for p in files:
        fsio.unlink(p, missing_ok=True)
    if files:
        fsync_dir(vault_dir)
        log.warning("vault %s: removed %d file(s) of a key change that did not finish; the vault keeps its previous key",
                    vault_id, len(files))


def finish_rekey(vault_dir: Path, vault_id: str, epoch: int) -> None:
    """Move a switched key change's staged files into place; idempotent, so a crash at any step
    is finished by the next call (unlock calls it when the staged head opens under the header's key).

    1. While the staged log is still staged, every derived file without the prefix is one of the
       old key: remove them all (nothing staged has been moved yet).
    2. Move the staged log into place: from then on step 1 is done.
    3. Move every other staged derived file into place.
    4. Move the staged head over ``head.bin``: the vault now reads as its new key says. The log of
       the old key is of an older epoch, and :func:`clean_leftovers` removes it.
    """
    staged_log = vault_dir / f"{REKEY_PREFIX}log-{epoch:08d}.bin"
    if staged_log.exists():
        removed = 0
        for pattern in DERIVED_FILES:
            for p in sorted(vault_dir.glob(pattern)):
                fsio.unlink(p, missing_ok=True)
                removed += 1
        if removed:
            fsync_dir(vault_dir)
        fsio.replace(staged_log, vault_dir / staged_log.name[len(REKEY_PREFIX) :])
        fsync_dir(vault_dir)
    moved = False
    for p in staged_files(vault_dir):
        if p.name != REKEY_HEAD:
            fsio.replace(p, vault_dir / p.name[len(REKEY_PREFIX) :])
            moved = True
    if moved:
        fsync_dir(vault_dir)
    head = vault_dir / REKEY_HEAD
    if head.exists():
        fsio.replace(head, vault_dir / HEAD_NAME)
        fsync_dir(vault_dir)
