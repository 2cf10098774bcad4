"""Keeping one vault's lexical snapshot: restore at the first build, write when it is worth it.

:class:`SnapshotKeeper` belongs to a :class:`~memoriesd.index.caches.VaultIndex` and owns the
vault's ``lexical-index.bin`` (format: :mod:`memoriesd.index.snapshot`) while the vault is
unlocked.

Restore (:meth:`SnapshotKeeper.restore`, at the index's first build). The snapshot is used when
it was built from the vault's current head, or from an earlier head of the same log: the log
file's hash chain is walked up to the snapshot's head (:func:`~.snapshot.log_extends`), which
proves that every record revision the snapshot indexed is, byte for byte, in the current log.
Fragment text comes back from those revisions by byte range, no record is re-fragmented and no
row re-segmented; the index then applies only what changed after the snapshot's head (records
added, changed or removed), like any refresh. Anything else (missing, other version, damaged,
another vault's, a compacted or rolled-back log) is discarded and the index is rebuilt. Unlock
starts the restore in the background (:func:`~memoriesd.index.caches.restore_after_unlock`); it
checks between its steps whether the vault started locking and then stops (``cancelled``), so lock
never waits for a whole restore.

Writes happen only once the index has FTS5 rows (a lexical query ran, or it was restored), never
segment anything, and skip documents whose rows are still pending:

- in the background, :data:`SETTLE_SECONDS` after the last change, when there is no snapshot yet
  or at least :data:`WRITE_AFTER_ROWS` rows changed since the one on disk (fewer changes cost the
  next unlock little to catch up, while each write is the whole index);
- after a large change, by the lexical upkeep (:mod:`memoriesd.index.upkeep`), which first builds
  the index and writes its pending rows when nothing else did (no search since the change);
- at lock, eviction or shutdown (:meth:`SnapshotKeeper.close`), under the same condition, with
  the key still valid: the vault closes the index before it wipes the vault key, and the keeper's
  own subkey is wiped only after;
- after ``vault compact`` (:meth:`SnapshotKeeper.after_compaction`): rewritten from a purged
  database (no trace of removed rows) and bound to the new head, or removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..bulk import bulk_load
from ..text.fragments import FINGERPRINT_HEX, Fragment
from ..text.segment import DEFAULT
from ..vault import crypto
from ..vault.format import Head
from ..vault.records import Record
from ..vault.store import VaultStore
from .bm25 import BM25Index
from .docs import IndexedDoc, embed_input
from .snapshot import (
    SnapshotRejected,
    log_extends,
    read_snapshot,
    remove_snapshot,
    version_tag,
    write_snapshot,
)
from .vectors.names import CONTENT_KEY_HEX, content_key

log = logging.getLogger("memoriesd.index")

#: Rows changed since the snapshot on disk before a background write is worth a whole new file.
WRITE_AFTER_ROWS = 1000
#: Quiet time after the last change before a background write (an ingest's batches settle).
SETTLE_SECONDS = 2.0
#: How often the background writer looks.
POLL_SECONDS = 1.0
#: After a failed write (disk full...), wait this long before the next attempt.
RETRY_SECONDS = 60.0

MakeDoc = Callable[[Record, tuple[Fragment, ...]], IndexedDoc]
Lookup = Callable[[str, int], "Record | None"]


def encode_meta(
    docs: list[tuple[IndexedDoc, int]],
    exact: list[int],
    next_id: int,
    content_keys: list[str] | None = None,
    *,
    complete: bool = False,
) -> dict[str, Any]:
    """What the snapshot says about its rows: no text, only ids, revisions and byte ranges, and
    (``content_keys``: one string per document, :data:`CONTENT_KEY_HEX` characters per fragment)
    the key of each fragment's vector, so the first vector search after unlock need not compute
    them (:meth:`SnapshotKeeper.content_key_for`). ``complete``: the documents are every searchable
    record of the head the snapshot is bound to (none left out as pending or empty), so a restore
    at that very head needs no comparison with the vault's records."""
    out_docs: list[list[object]] = []
    fps: list[str] = []
    for doc, first in docs:
        spans: list[int] = []
        for f in doc.fragments:
            spans += (f.ordinal, f.start, f.end)
            fps.append(f.fingerprint)
        out_docs.append([doc.record_id, doc.revision, first, spans])
    return {
        "next_id": next_id,
        "docs": out_docs,
        "fp": "".join(fps),
        "ck": "".join(content_keys) if content_keys is not None else "",
        "exact": exact,
        "source_bytes": sum(doc.source_bytes for doc, _ in docs),
        "complete": complete,
    }


@dataclass
class Decoded:
    docs: list[tuple[IndexedDoc, int]]  # each document with its first frag_id
    exact: list[int]
    next_id: int
    source_bytes: int
    content_keys: str = ""  # CONTENT_KEY_HEX characters per fragment, in document order ("" when none)
    complete: bool = False  # see encode_meta


_new = object.__new__
_set = object.__setattr__


def _fragment(rid: str, rev: int, ordinal: int, start: int, end: int, text: str, fp: str) -> Fragment:
    """``Fragment(...)`` without the frozen dataclass's seven ``__setattr__`` calls (a restore makes
    one per fragment: half the cost of the object). The same fields, equal and hashing alike."""
    frag = _new(Fragment)
    _set(frag, "__dict__", {"record_id": rid, "revision": rev, "ordinal": ordinal, "start": start, "end": end,
                            "text": text, "fingerprint": fp})
    return frag


def decode_meta(meta: dict[str, Any], lookup: Lookup, make_doc: MakeDoc, check: Callable[[], None] = lambda: None) -> Decoded:
    """The documents of a snapshot rebuilt from the vault's records (:class:`SnapshotRejected`
    when a revision it names is not in the vault or a byte range does not fit its text).
    ``check`` runs every 4,096 documents (it raises to stop)."""
    try:
        fps: str = meta["fp"]
        next_id = int(meta["next_id"])
        exact = [int(i) for i in meta["exact"]]
        source_bytes = int(meta["source_bytes"])
        out: list[tuple[IndexedDoc, int]] = []
        pos = 0
        step = FINGERPRINT_HEX
        for n, (rid, rev, first, spans) in enumerate(meta["docs"]):
            if not n & 4095:
                check()
            rec = lookup(rid, rev)
            if rec is None:
                raise SnapshotRejected("a record revision it indexed is not in the vault")
            rid, rev, body = rec.id, rec.revision, rec.body
            frags: list[Fragment] = []
            ascii_body = body.isascii()  # characters are bytes: slice the text itself
            data = b"" if ascii_body else body.encode("utf-8")
            size = len(body) if ascii_body else len(data)
            it = iter(spans)
            for ordinal, start, end in zip(it, it, it, strict=True):
                if not 0 <= start <= end <= size:
                    raise SnapshotRejected("a fragment's byte range does not fit its record")
                text = body[start:end] if ascii_body else data[start:end].decode("utf-8")
                frags.append(_fragment(rid, rev, ordinal, start, end, text, fps[pos : pos + step]))
                pos += step
            out.append((make_doc(rec, tuple(frags)), first))
        if pos != len(fps):
            raise SnapshotRejected("its fragment list is inconsistent")
        ckeys = str(meta.get("ck", ""))
        if ckeys and len(ckeys) != (len(fps) // step) * CONTENT_KEY_HEX:
            raise SnapshotRejected("its fragment list is inconsistent")
        return Decoded(out, exact, next_id, source_bytes, ckeys, meta.get("complete") is True)
    except SnapshotRejected:
        raise
    except (KeyError, TypeError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise SnapshotRejected("its index description is malformed") from exc


class IndexOwner(Protocol):
    """What the keeper uses of the index it keeps (:class:`memoriesd.index.caches.VaultIndex`)."""

    @property
    def lock(self) -> AbstractContextManager[object]: ...

    @property
    def bm25(self) -> BM25Index | None: ...

    @property
    def head(self) -> Head | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def docs(self) -> dict[str, IndexedDoc]: ...

    def check_open(self) -> None: ...

    def refresh(self) -> bool: ...


class SnapshotKeeper:
    """The lexical snapshot of one unlocked vault's index (see the module docstring)."""

    def __init__(self, store: VaultStore, owner: IndexOwner) -> None:
        self.store = store
        self.owner = owner  # the VaultIndex: its lock, bm25, head and refresh
        self.dir = Path(store.dir)
        self.vault_id = store.vault_id
        self.version = version_tag(DEFAULT)
        self._sealer = store.keys.sealer(crypto.LABEL_LEXICAL_SNAPSHOT)
        self._fp_key = store.keys.subkey(crypto.LABEL_FINGERPRINT)  # content keys (see encode_meta)
        # record id -> (revision, the content keys of its fragments joined): from the restored
        # snapshot, or computed for a write; replaced at each write (removed records drop out).
        self._ckeys: dict[str, tuple[int, str]] = {}
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_disk: Head | None = None  # head of the snapshot known to be on disk (None: none usable)
        self._rows_at_write = 0  # bm25.rows_changed when the snapshot on disk was taken
        self._last_change = time.monotonic()
        self._last_rows = 0
        # What happened, for the log and status: source "snapshot" or "built", catch-up counts, rejection.
        self.info: dict[str, Any] = {"source": None}

    # ------------------------------------------------------------------ restore

    def restore(self, make_doc: MakeDoc) -> tuple[BM25Index, dict[str, IndexedDoc], Head] | None:
        """The index as the snapshot holds it, its documents and the head it was built from; None
        when there is no usable snapshot (a rejected file is removed). Caller holds the owner's lock."""
        t0 = time.perf_counter()
        check = self.owner.check_open
        try:
            image = read_snapshot(self.dir, self.vault_id, self._sealer, self.version, check=check)
            with self.store.exclusive():
                head = self.store.head
            if image.head != head and not log_extends(self.dir, self.vault_id, image.head, head):
                raise SnapshotRejected("it was built from another state of the vault (compacted or restored since)", stale=True)
            with bulk_load():  # a few hundred thousand objects that all stay alive
                with self.store.exclusive():  # every lookup sees the epoch checked here
                    if self.store.head.epoch != image.head.epoch:
                        raise SnapshotRejected("the vault was compacted meanwhile", stale=True)
                    dec = decode_meta(image.meta, self._lookup, make_doc, check)
                del image.meta
                check()
                try:
                    bm25 = BM25Index.restore(image.db, dec.docs, dec.exact, dec.next_id, dec.source_bytes, segmentation=DEFAULT)
                except (ValueError, MemoryError) as exc:
                    raise SnapshotRejected("its database does not match its description") from exc
                except Exception as exc:  # noqa: BLE001 - sqlite3 refusing the bytes: never trusted
                    raise SnapshotRejected(f"its database cannot be opened ({type(exc).__name__})") from exc
                docs = {doc.record_id: doc for doc, _ in dec.docs}
                if dec.content_keys:
                    ck, at = dec.content_keys, 0
                    for doc, _ in dec.docs:
                        end = at + CONTENT_KEY_HEX * len(doc.fragments)
                        self._ckeys[doc.record_id] = (doc.revision, ck[at:end])
                        at = end
        except SnapshotRejected as exc:
            self._reject(exc)
            return None
        self.on_disk = image.head
        self._rows_at_write = 0
        self.info = {
            "source": "snapshot",
            "restored_fragments": bm25.held_fragments(),
            "restore_seconds": round(time.perf_counter() - t0, 3),
            "exact_head": image.head == head,
            # Every searchable record of exactly the current head: the first refresh compares nothing.
            "complete": image.head == head and dec.complete,
        }
        return bm25, docs, image.head

    def content_key_for(self, doc: IndexedDoc, frag: Fragment) -> str | None:
        """The content key of a fragment's vector when this keeper knows it (restored with the
        snapshot, or computed for a write) for this very revision; None otherwise."""
        entry = self._ckeys.get(doc.record_id)
        if entry is None or entry[0] != doc.revision or len(entry[1]) != CONTENT_KEY_HEX * len(doc.fragments):
            return None
        for pos, f in enumerate(doc.fragments):
            if f is frag:  # by identity: an equality test compares every field
                return entry[1][pos * CONTENT_KEY_HEX : (pos + 1) * CONTENT_KEY_HEX]
        return None

    def content_keys_of(self, vault_index: IndexOwner, frag_ids: Collection[int]) -> dict[int, str]:
        """:meth:`content_key_for` of many live fragments at once (the first vector search after
        unlock asks for every fragment): walks the documents, not the fragments one by one. Those
        it does not know are left out."""
        bm25 = vault_index.bm25
        if bm25 is None or not self._ckeys:
            return {}
        wanted = frag_ids if isinstance(frag_ids, (set, frozenset, dict)) else set(frag_ids)
        out: dict[int, str] = {}
        frags = bm25.fragments
        step = CONTENT_KEY_HEX
        for rid, doc in vault_index.docs.items():
            entry = self._ckeys.get(rid)
            if entry is None or entry[0] != doc.revision or len(entry[1]) != step * len(doc.fragments):
                continue
            keys = entry[1]
            for pos, fid in enumerate(bm25.frag_ids(rid)):  # a document's fragments in order
                if fid in wanted and frags[fid][1] is doc.fragments[pos]:
                    out[fid] = keys[pos * step : (pos + 1) * step]
        return out

    def content_key_runs(self, vault_index: IndexOwner) -> tuple[list[int], str]:
        """The bulk form of :meth:`content_keys_of` for a first load: every live fragment whose key
        this keeper knows (in document order) and their keys joined, :data:`CONTENT_KEY_HEX`
        characters each; no per-fragment lookup."""
        bm25 = vault_index.bm25
        fids: list[int] = []
        parts: list[str] = []
        if bm25 is None or not self._ckeys:
            return fids, ""
        step = CONTENT_KEY_HEX
        for rid, doc in vault_index.docs.items():
            entry = self._ckeys.get(rid)
            if entry is None or entry[0] != doc.revision or len(entry[1]) != step * len(doc.fragments):
                continue
            ids = bm25.frag_ids(rid)
            if len(ids) == len(doc.fragments):
                fids.extend(ids)
                parts.append(entry[1])
        return fids, "".join(parts)

    def _content_keys(self, docs: list[tuple[IndexedDoc, int]]) -> list[str]:
        """The content keys of every exported document's fragments (known ones reused), for the
        snapshot; computing one costs what the first vector search after unlock would pay."""
        if getattr(self._fp_key, "wiped", False):
            raise crypto.KeyWiped("the fingerprint key was wiped (the vault was locked)")
        known = self._ckeys
        fresh: dict[str, tuple[int, str]] = {}
        out: list[str] = []
        for doc, _ in docs:
            entry = known.get(doc.record_id)
            if entry is None or entry[0] != doc.revision or len(entry[1]) != CONTENT_KEY_HEX * len(doc.fragments):
                entry = (doc.revision, "".join(content_key(self._fp_key, *embed_input(doc, f)) for f in doc.fragments))
            fresh[doc.record_id] = entry
            out.append(entry[1])
        self._ckeys = fresh
        return out

    def _lookup(self, record_id: str, revision: int) -> Record | None:
        """A record revision, usually the latest (the caller is inside ``store.exclusive()``)."""
        return self.store.revision_of(record_id, revision)

    def _reject(self, exc: SnapshotRejected) -> None:
        self.info = {"source": "built", "rejected": exc.reason}
        if exc.reason == "there is none":
            return
        log.log(logging.INFO if exc.stale else logging.WARNING,
                "vault %s: lexical snapshot not used (%s): the index is rebuilt", self.vault_id, exc.reason)
        try:
            remove_snapshot(self.dir)
        except OSError as err:
            log.warning("vault %s: cannot remove the unused lexical snapshot (%s)", self.vault_id, err.strerror)

    def caught_up(self, added: int, removed: int) -> None:
        """Note the records a restored index applied after the snapshot's head."""
        if self.info.get("source") == "snapshot" and "caught_up_records" not in self.info:
            self.info["caught_up_records"] = added
            self.info["removed_records"] = removed
            log.info(
                "vault %s: lexical index restored from its sealed snapshot (%d fragments, %d records "
                "caught up, %d removed) in %.3f s",
                self.vault_id, self.info["restored_fragments"], added, removed, self.info["restore_seconds"],
            )

    # ------------------------------------------------------------------ writing

    def start(self) -> None:
        """Start the background writer (once)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name=f"memoriesd-lexsnap-{self.vault_id}", daemon=True)
            self._thread.start()

    def due(self) -> bool:
        """Whether a write is worth it now: the index has rows and no snapshot on disk, or at least
        :data:`WRITE_AFTER_ROWS` rows changed since the one on disk."""
        return self._due(self.owner.bm25)

    def _due(self, bm25: BM25Index | None) -> bool:
        if bm25 is None or not bm25.has_rows:
            return False
        return self.on_disk is None or bm25.rows_changed - self._rows_at_write >= WRITE_AFTER_ROWS

    def _run(self) -> None:
        retry_at = 0.0
        while not self._stop.wait(POLL_SECONDS):
            try:
                bm25 = self.owner.bm25
                if bm25 is not None and bm25.rows_changed != self._last_rows:
                    self._last_rows = bm25.rows_changed
                    self._last_change = time.monotonic()
                now = time.monotonic()
                if now >= retry_at and now - self._last_change >= SETTLE_SECONDS and self._due(bm25):
                    self.write("settled", if_due=True)
            except crypto.KeyWiped:
                return
            except Exception as exc:  # noqa: BLE001 - a failed write never affects search
                retry_at = time.monotonic() + RETRY_SECONDS
                log.warning("vault %s: the lexical snapshot was not written (%s)", self.vault_id, _why(exc))

    def write(self, why: str, *, if_due: bool = False) -> bool:
        """Export the index and replace the snapshot (True when written). ``if_due``: only when
        :meth:`due` still holds once the write lock is held (another writer may have just written)."""
        with self._write_lock:
            if if_due and not self.due():
                return False
            return self._write_locked(why)

    def _write_locked(self, why: str, *, purge: bool = False) -> bool:
        """Caller holds ``_write_lock``. Takes the owner's lock only to export (about 0.1 s per
        100,000 fragments); sealing and the disk write run outside it, so searches go on."""
        owner = self.owner
        with owner.lock:
            bm25 = owner.bm25
            head = owner.head
            if owner.closed or bm25 is None or not bm25.has_rows or head is None:
                return False
            if purge:
                if head.epoch != self.store.head.epoch:
                    return False
                bm25.purge()
            t0 = time.perf_counter()
            complete = bm25.exports_every_document
            db, docs, exact, next_id, rows = bm25.export(flush=False)
        meta = encode_meta(docs, exact, next_id, self._content_keys(docs), complete=complete)
        size = write_snapshot(self.dir, self.vault_id, self._sealer, head, self.version, meta, db)
        self.on_disk = head
        self._rows_at_write = rows
        self.info["written"] = why
        log.info("vault %s: lexical snapshot written (%s): %d fragments, %.1f MiB sealed in %.2f s",
                 self.vault_id, why, sum(len(d.fragments) for d, _ in docs), size / 2**20, time.perf_counter() - t0)
        return True

    def after_compaction(self) -> str:
        """``vault compact`` ran: rewrite the snapshot from a purged index (no trace of removed rows)
        bound to the new head, or remove it when the index has no rows. Returns what was done."""
        owner = self.owner
        with self._write_lock:  # no background write before or after this one
            with owner.lock:
                try:
                    owner.refresh()
                except Exception:  # noqa: BLE001 - caps, a lock meanwhile: the snapshot is removed instead
                    pass
            try:
                if self._write_locked("compacted", purge=True):
                    return "rewritten"
            except Exception as exc:  # noqa: BLE001
                log.warning("vault %s: the lexical snapshot was not rewritten after compaction (%s)", self.vault_id, _why(exc))
            self.on_disk = None
            return "removed" if remove_snapshot(self.dir) else "none"

    def close(self) -> None:
        """Stop the writer, write once more if due (the key is still valid here), wipe the subkey."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        try:
            if self._due(self.owner.bm25):
                self.write("lock")
        except Exception as exc:  # noqa: BLE001 - lock never fails for a snapshot
            log.warning("vault %s: the lexical snapshot was not written at lock (%s)", self.vault_id, _why(exc))
        finally:
            with self._write_lock:
                self._sealer.wipe()
                crypto.wipe(self._fp_key)
                self._ckeys = {}


def _why(exc: BaseException) -> str:
    """A reason safe to log: an OS error's text or an exception's type, never content."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


__all__ = ["SnapshotKeeper", "WRITE_AFTER_ROWS", "SETTLE_SECONDS", "decode_meta", "encode_meta"]
