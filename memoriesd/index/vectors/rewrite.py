"""Rewriting a vector sidecar: :func:`repack` (narrower rows, full chunks; in the background after a
load, :func:`repack_after_load`), :func:`reseal` (a copy under the vault's new key) and
:func:`retain` (only the entries of live fragments).

:func:`repack` and :func:`reseal` stream one file into another a chunk at a time through
:func:`_copy` (a temp file O_EXCL 0600, fsync, rename, fsync dir); :func:`retain` reads the whole
file and rewrites it with :meth:`VectorStore._rewrite`. The file format is in
:mod:`~memoriesd.index.vectors.sidecar`.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ...errors import MemoriesError
from ...vault import fsio
from ...vault.format import fsync_dir
from .chunks import Chunk, encode_chunk, narrowest
from .names import rekeyed
from .sidecar import (
    _FRAME,
    CHUNK_ENTRIES,
    HEADER_SIZE,
    MAGIC,
    SLOT_SIZE,
    VectorStore,
    _chain,
    _Damage,
    _damage_reason,
    _State,
    _TakeFailed,
    log,
)


class _Repacking:
    """:func:`repack`'s (and :func:`reseal`'s) output: entries re-encoded and sealed by ``store``
    into ``fd`` a chunk at a time.

    ``rename`` (reseal): only entries whose key it maps are kept, under the new key; ``keep_encoding``:
    each row stays in the encoding its chunk had (decoding and encoding again gives the same bytes),
    instead of ``store.encoding``."""

    def __init__(self, store: VectorStore, fd: int, *, rename: Mapping[str, str] | None = None, keep_encoding: bool = False) -> None:
        self.store = store
        self.fd = fd
        self.rename = rename
        self.keep_encoding = keep_encoding
        self.encoding = store.encoding
        self.keys: list[str] = []
        self.rows: list[np.ndarray] = []
        self.chunks = 0
        self.end = HEADER_SIZE
        self.chain = b""
        self.entries = 0
        self.dropped = 0

    def take(self, chunk: Chunk) -> None:
        keys = chunk.keys
        if self.rename is None:
            rows = chunk.decoded()
        else:
            rename = self.rename
            picks = [i for i, k in enumerate(keys) if k in rename]
            self.dropped += len(keys) - len(picks)
            if not picks:
                return
            rows = chunk.decoded(None if len(picks) == len(keys) else np.asarray(picks))
            keys = [rename[keys[i]] for i in picks]
        encoding = chunk.encoding if self.keep_encoding else self.store.encoding
        if encoding != self.encoding:
            self._emit()  # one encoding per chunk
            self.encoding = encoding
        self.keys.extend(keys)
        self.rows.append(rows)
        if len(self.keys) >= CHUNK_ENTRIES:
            self._emit()

    def _emit(self) -> None:
        if not self.keys:
            return
        st = self.store
        plain = encode_chunk(self.keys, np.concatenate(self.rows), self.encoding)
        blob = st._seal(plain, st._chunk_aad(self.chunks))
        self.chain = _chain(self.chain, blob)
        fsio.write_all(self.fd, _FRAME.pack(len(blob)) + blob)
        self.end += _FRAME.size + len(blob)
        self.chunks += 1
        self.entries += len(self.keys)
        self.keys, self.rows = [], []

    def finish(self) -> _State:
        """Write the last chunk and the commit (slot 0), fsync; the file's state."""
        self._emit()
        state = _State(1, self.chunks, self.end, self.chain, 0, 2)
        fsio.pwrite_all(self.fd, self.store._commit_bytes(state), len(MAGIC))
        fsio.fsync(self.fd)
        return state


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _copy(
    source: VectorStore, read: Callable[[], BinaryIO], target: VectorStore, tmp: Path, *,
    rename: Mapping[str, str] | None = None, keep_encoding: bool = False, skip_empty: bool = False,
) -> tuple[_Repacking, _State | None, _Damage | None]:
    """Stream ``source``'s file (opened by ``read``, after ``tmp`` is created) into the new file
    ``tmp``, sealed by ``target``, and put it in place of ``target.path`` (fsync, rename, fsync dir).

    Returns the output, its state (None when nothing was put in place: the source is damaged, or
    ``skip_empty`` and no entry was kept; ``tmp`` is then left for the caller to remove) and the
    source's damage. Errors of ``take`` (sealing, writing) and read errors are raised as they are,
    after ``tmp`` is removed."""
    damaged: _Damage | None = None
    state: _State | None = None
    try:
        out = _Repacking(target, fsio.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600),
                         rename=rename, keep_encoding=keep_encoding)
        try:
            fsio.write_all(out.fd, MAGIC + bytes(2 * SLOT_SIZE))
            with read() as f:
                try:
                    source._scan(f, out.take)
                except _TakeFailed as failed:  # sealing or writing the new file failed
                    raise failed.error from None
                except OSError:
                    raise
                except _Damage as exc:  # the source file is damaged
                    damaged = exc
            if damaged is None and (not skip_empty or out.entries + len(out.keys)):
                state = out.finish()
        finally:
            fsio.close(out.fd)
        if state is not None:
            fsio.replace(tmp, target.path)
            fsync_dir(target.path.parent)
    except BaseException:
        fsio.unlink(tmp, missing_ok=True)
        raise
    return out, state, damaged


def repack(store: VectorStore) -> int | None:
    """Rewrite the file when :attr:`VectorStore.needs_repack`: every row in its :attr:`encoding`,
    chunks of :data:`CHUNK_ENTRIES`, so the next read copies rows as stored, a few chunks at all.
    Streams: one chunk in memory at a time, entries kept in file order (a later duplicate still
    wins). Returns the entries rewritten; None when there was nothing to do or the file turned
    out damaged (then it is discarded, as :meth:`VectorStore.load` does)."""
    with store._lock:
        if not store.needs_repack:
            return None
        tmp = _temp_path(store.path)
        try:
            out, state, damaged = _copy(store, lambda: open(store.path, "rb"), store, tmp)
        except OSError as exc:
            raise store._write_error(exc) from exc
        if damaged is not None:
            fsio.unlink(tmp, missing_ok=True)
            log.warning("vector cache %s is damaged (%s); discarded, its vectors will be recomputed",
                        store.path.name, _damage_reason(damaged))
            store._discard()
            return None
        store._state = state
        store.needs_narrowing = False
        store.file_encoding = store.encoding
        store._read_entries, store._read_chunks = out.entries, out.chunks
        return out.entries


def repack_after_load(store: VectorStore) -> None:
    """:func:`repack`, run in the background after the load that answers the first search (a
    version-1 file, rows written at another precision, or many small appended chunks), so the next
    unlock copies rows as stored. Holds only the sidecar's own lock (an append waits for it); the
    vector space's ``close`` (lock) waits for it to end, once per file, so a quick lock after the
    first search does not leave the file unpacked. A failure leaves the old file as it was."""
    t0 = time.perf_counter()
    try:
        done = repack(store)
    except MemoriesError as exc:
        log.warning("vector cache %s was not rewritten (%s)", store.path.name, exc.code)
        return
    except Exception as exc:  # noqa: BLE001 - the key wiped by a lock: the old file stays
        log.info("vector cache %s was not rewritten (%s)", store.path.name, type(exc).__name__)
        return
    if done is not None:
        log.info("vector cache %s rewritten in %s: %d vectors in %.2f s", store.path.name,
                 store.encoding, done, time.perf_counter() - t0)


def reseal(source: VectorStore, target: VectorStore, rename: Mapping[str, str]) -> tuple[int, int] | None:
    """Write ``target`` (another file, sealed by its own functions: the vault's new key) with
    the entries of ``source`` whose key ``rename`` maps, under their new keys, each row in the
    encoding it was stored in: a key change keeps every vector without embedding anything
    again. Streams a chunk at a time; the new file goes through a temp file (O_EXCL 0600,
    fsync, rename, fsync dir). Returns (kept, dropped); None when the source is missing or
    damaged (then nothing is written and the source is left as it is: its vectors are
    recomputed). Write errors are raised as they are (``OSError``)."""
    with source._lock:
        try:
            src = open(source.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        tmp = _temp_path(target.path)
        with src:
            out, state, damaged = _copy(source, lambda: src, target, tmp, rename=rename, keep_encoding=True, skip_empty=True)
        if state is None:
            fsio.unlink(tmp, missing_ok=True)
        if damaged is not None:
            log.warning("vector cache %s is damaged (%s); its vectors will be recomputed",
                        source.path.name, _damage_reason(damaged))
            return None
        return out.entries, out.dropped


def retain(store: VectorStore, keep: Collection[str], rename: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """Rewrite the file with only the entries whose key is in ``keep`` (compaction), atomically
    and durably; a file left with no entry is removed. ``rename`` (old key -> new key) re-keys
    entries first (old-scheme keys; an entry already under the new key wins). Returns (kept,
    dropped), or None when the file was damaged (then it is discarded, as
    :meth:`VectorStore.load` does) or missing."""
    with store._lock:
        try:
            parsed = store._read_committed()
        except OSError as exc:
            raise store._write_error(exc) from exc
        if parsed is None:
            return None
        entries = rekeyed(parsed[1], rename or {})
        kept = {k: v for k, v in entries.items() if k in keep}
        if kept:
            store._rewrite(kept, narrowest(store.encoding, store.file_encoding))
        else:
            store._discard()
        return len(kept), len(entries) - len(kept)
