"""Vectors of one vault for one embedder identity: in memory, and sealed at rest.

Each vector is keyed by its content: a keyed hash of exactly what the model reads (the record's
title or none, and the fragment's text; :func:`~memoriesd.index.vector_store.content_key`), bound
to the embedder's identity (the sidecar's associated data), so a different model, prompt or title
never reuses a vector, while the same input does wherever it is: an edit near the top of a note
re-embeds only the fragments whose text changed (byte offsets are not part of the key; results
still carry them from the fragment), and a passage in two notes has one vector. Unlock or restart
reload vectors from the sealed sidecar instead of re-embedding (a chunk at a time, straight into the
index's representation, with the content keys the restored lexical snapshot holds); vault changes embed only fragments
whose key is new. A sidecar of the old scheme (keys from the fragment fingerprint and title) is
re-keyed once on attach and rewritten, without re-embedding. ``vault compact`` rewrites every sidecar the vault's
space list knows to the vectors of live fragments (:func:`compact_vectors`); ``rag status`` counts
sealed vectors before they are loaded (:func:`sealed_status`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from ..errors import Cancelled, CapExceeded, InvalidModelOutput, MemoriesError, ModelInputFailed
from ..index.caches import embed_input
from ..index.vector_store import (
    VectorStore,
    content_key,
    entry_key,
    is_legacy_key,
    list_sidecars,
    read_spaces,
    rekeyed,
    sidecar_opaque_id,
    sidecar_path,
    write_spaces,
)
from ..index.vectors import VectorIndex, check_vector_cap, vector_bytes
from ..vault import crypto

log = logging.getLogger("memoriesd.vectors")
BATCH_FRAGMENTS = 32
#: Benchmark switch only (``scripts/bench_first_search.py`` measures before/after in one run): load
#: the sidecar whole, decoded to float32, as before streaming. Never set it otherwise.
_WHOLE_FILE_LOAD = os.environ.get("MEMORIES_BENCH_WHOLE_FILE_VECTORS") == "1"
#: Spare vectors (not used by a live fragment) kept in memory, as a share of max_vector_mib.
SPARE_SHARE = 0.25
#: Rows a sidecar read gathers before adding them to the index (bounds its float32 temporaries).
_STREAM_ADD_ROWS = 4096


def sidecar_id(vault_key: bytes | bytearray, identity: str) -> str:
    key = crypto.subkey(vault_key, crypto.LABEL_VECTOR_NAMES)
    try:
        return crypto.mac(key, identity.encode("utf-8")).hex()[:32]
    finally:
        crypto.wipe(key)


_spaces_lock = threading.Lock()  # read-modify-write of a vault's vector-spaces.bin


def register_space(store: Any, sealer: crypto.Sealer, identity: str, dims: int) -> None:
    """Note in the vault's sealed space list that ``identity`` (``dims``) is in use now, so
    compaction can open its sidecar and status can count it before the model is loaded."""
    oid = sidecar_id(store.key, identity)
    with _spaces_lock:
        spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
        spaces[oid] = {"identity": identity, "dims": int(dims), "used": time.time()}
        try:
            write_spaces(store.dir, spaces, vault_id=store.vault_id, seal=sealer.seal)
        except OSError as exc:
            log.warning("vault %s: cannot write the vector space list (%s)", store.vault_id, exc.strerror)


def live_fragment_keys(store: Any, *, legacy: bool = False) -> list[tuple[str, str | None]]:
    """``(content key, old-scheme key or None)`` of every fragment of the vault's live, searchable
    records (one per fragment), computed exactly as the index does (same fragments, same
    fingerprint subkey, same embedder input); builds no index. ``legacy``: also the key the
    fragment's vector had before content keys (to read or re-key an old sidecar)."""
    from ..index.caches import index_doc

    fp_key = crypto.subkey(store.key, crypto.LABEL_FINGERPRINT)
    try:
        out: list[tuple[str, str | None]] = []
        for rec in store.latest():
            if not rec.searchable:
                continue
            doc = index_doc(rec, bytes(fp_key))
            for frag in doc.fragments:
                title, text = embed_input(doc, frag)
                out.append((content_key(fp_key, title, text), entry_key(frag.fingerprint, doc.title) if legacy else None))
        return out
    finally:
        crypto.wipe(fp_key)


def _legacy_rename(pairs: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    return {old: new for new, old in pairs if old is not None}


def compact_vectors(store: Any, vault_index: Any = None) -> dict[str, int]:
    """After the log is compacted: rewrite every sealed sidecar of the vault whose model the space
    list knows so it holds only vectors of live, searchable fragments (deleted records, old revisions
    and old titles go); a sidecar left empty is removed. A sidecar of unknown identity (written
    before the space list existed and not used since) cannot be opened: it is kept and counted.

    Holds the index lock (no vector space is created or replaced meanwhile), the attached space's
    lock (no append interleaves) and the store lock (the key stays valid, records do not change).
    """
    stats = {"vector_entries_kept": 0, "vector_entries_dropped": 0, "vector_files": 0, "vector_files_skipped": 0}
    with contextlib.ExitStack() as stack:
        if vault_index is not None:
            stack.enter_context(vault_index.lock)
        space = vault_index.vectors if vault_index is not None else None
        if space is not None:
            stack.enter_context(space.lock)
        with store.lock:
            pairs = live_fragment_keys(store, legacy=True)  # raises VaultLocked when locked meanwhile
            keep = {new for new, _ in pairs}
            rename = _legacy_rename(pairs)  # a sidecar not re-keyed yet keeps its live vectors
            sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
            try:
                spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
                for path in list_sidecars(store.dir):
                    if space is not None and path == space.sidecar.path:
                        result = space.retain(keep, rename)
                    elif sidecar_opaque_id(path) in spaces:
                        entry = spaces[sidecar_opaque_id(path)]
                        result = VectorStore(
                            path,
                            vault_id=store.vault_id,
                            identity=str(entry["identity"]),
                            dims=int(str(entry["dims"])),
                            seal=sealer.seal,
                            open_=sealer.open,
                        ).retain(keep, rename)
                    else:
                        stats["vector_files_skipped"] += 1
                        log.warning("vault %s: vector cache %s has no known model identity; left as is",
                                    store.vault_id, path.name)
                        continue
                    if result is not None:
                        stats["vector_files"] += 1
                        stats["vector_entries_kept"] += result[0]
                        stats["vector_entries_dropped"] += result[1]
            finally:
                sealer.wipe()
    return stats


def sealed_status(store: Any, *, identity: str | None, dims: int | None, remote: bool) -> dict[str, Any] | None:
    """``rag status`` before vectors are loaded: how many live fragments have a sealed vector.

    ``identity``/``dims`` are the active embedder's when known without loading a model; else the
    identity this vault used last (local or remote as ``remote`` says) from its space list. Reads
    the space list and one sidecar's keys; embeds nothing and builds no index. None when unknown.
    """
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
        if identity is None:
            used = [(float(str(e["used"])), oid) for oid, e in spaces.items() if str(e["identity"]).startswith("remote:") == remote]
            if not used:
                if list_sidecars(store.dir):
                    return None  # vectors of an identity this daemon cannot name yet
                return {"embedded": 0, "total": len(live_fragment_keys(store)), "vector_bytes": 0}
            oid = max(used)[1]
            identity, dims = str(spaces[oid]["identity"]), int(str(spaces[oid]["dims"]))
        else:
            oid = sidecar_id(store.key, identity)
            if dims is None and oid in spaces:
                dims = int(str(spaces[oid]["dims"]))
        path = sidecar_path(store.dir, oid)
        if not path.exists():
            keys: set[str] | None = set()
        elif dims is None:
            return None
        else:
            keys = VectorStore(
                path, vault_id=store.vault_id, identity=identity, dims=dims, seal=sealer.seal, open_=sealer.open
            ).peek_keys()
        if keys is None:
            return None
    finally:
        sealer.wipe()
    legacy = any(is_legacy_key(k) for k in keys)  # a sidecar not re-keyed yet (first attach does it)
    frag_keys = live_fragment_keys(store, legacy=legacy)
    embedded = sum(1 for new, old in frag_keys if new in keys or (old is not None and old in keys))
    out: dict[str, Any] = {"model": identity, "embedded": embedded, "total": len(frag_keys)}
    if dims is not None:
        out["dimensions"] = dims
        out["vector_bytes"] = vector_bytes(embedded, dims)
    else:
        out["vector_bytes"] = 0
    return out


def _key_hashes(keys: Sequence[str]) -> np.ndarray:
    """Sorted unique 8-byte hashes of entry keys (for :attr:`VectorSpace._evicted`)."""
    return np.unique(np.fromiter(
        (int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little") for k in keys),
        dtype=np.uint64, count=len(keys)))


class VectorSpace:
    """The vectors of one :class:`~memoriesd.index.caches.VaultIndex` under one embedder."""

    def __init__(self, vault_index: Any, identity: str, dims: int, max_vector_mib: float) -> None:
        store = vault_index.store
        self.identity = identity
        self.dims = dims
        self.max_vector_mib = max_vector_mib
        self._sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
        self._fp_key = crypto.subkey(store.key, crypto.LABEL_FINGERPRINT)  # keys vectors by content
        self.sidecar = VectorStore(
            sidecar_path(store.dir, sidecar_id(store.key, identity)),
            vault_id=store.vault_id,
            identity=identity,
            dims=dims,
            seal=self._sealer.seal,
            open_=self._sealer.open,
        )
        self.index = VectorIndex(dims, max_vector_mib=max_vector_mib, precision=vault_index.cache_cfg.vector_precision)
        self.skipped: set[str] = set()  # content keys of fragments the model cannot embed (this unlock)
        # Spare vectors by content key: sealed or recently dropped ones that no live fragment uses now
        # (kept for a fragment that comes back, e.g. an edit undone). Never the live ones (the index
        # holds those), and at most SPARE_SHARE of max_vector_mib; None until the sidecar is read.
        self._known: dict[str, np.ndarray] | None = None
        # Content key (its first 64 bits, ~8 MiB per 100,000 fragments) -> a fragment in the index
        # with that vector, so a fragment with the same model input (a passage in two notes) reuses
        # it instead of being embedded again; a reuse checks the holder's full key. An entry whose
        # fragment left the index is stale and ignored (frag ids are never reused).
        self._holder: dict[int, int] = {}
        # Sealed vectors held neither by the index nor as spares (trimmed): 8-byte hashes of their
        # keys, sorted, so attach() re-reads the sidecar only for a key it may hold, not for every
        # new text. A superset is harmless (one needless read); unknown (drop() without keys) is
        # _known_partial, which re-reads on any miss.
        self._evicted = np.empty(0, dtype=np.uint64)
        self._known_partial = False
        self.lock = threading.RLock()
        register_space(store, self._sealer, identity, dims)

    # ------------------------------------------------------------------ keys

    def key_of(self, vault_index: Any, frag_id: int) -> str:
        """The content key of a live fragment's vector (see the module docstring): the one the
        restored lexical snapshot holds when it has it (computing it costs about 9 µs of CPU here,
        0.9 s per 100,000 fragments at the first vector search after unlock), else computed."""
        doc, frag = vault_index.fragment(frag_id)
        keeper = getattr(vault_index, "keeper", None)
        if keeper is not None:
            key = keeper.content_key_for(doc, frag)
            if key is not None:
                return key
        return self._input_key(doc, frag)[1]

    def _input_key(self, doc: Any, frag: Any) -> tuple[tuple[str | None, str], str]:
        """What the embedder reads for the fragment, and its content key."""
        if getattr(self._fp_key, "wiped", False):
            raise crypto.KeyWiped("the fingerprint key was wiped (the vault was locked)")
        title, text = embed_input(doc, frag)
        return (title, text), content_key(self._fp_key, title, text)

    @staticmethod
    def _short(key: str) -> int:
        return int(key[:16], 16)

    def _is_held(self, key: str) -> bool:
        """Whether a fragment in the index may have ``key`` (not checked: for bookkeeping only)."""
        fid = self._holder.get(self._short(key))
        return fid is not None and fid in self.index

    def _held(self, vault_index: Any, key: str) -> np.ndarray | None:
        """The vector of ``key`` if a fragment in the index has exactly that key."""
        fid = self._holder.get(self._short(key))
        if fid is None or fid not in self.index:
            return None
        got = vault_index.get_fragment(fid)
        if got is None or self._input_key(*got)[1] != key:
            return None
        return self.index.get(fid)

    def _hold(self, pairs: Sequence[tuple[int, str]]) -> None:
        if not self._holder:  # the first load: every pair (a key held twice keeps either fragment)
            self._holder = {int(key[:16], 16): fid for fid, key in pairs}
            return
        for fid, key in pairs:
            old = self._holder.get(self._short(key))
            if old is None or old not in self.index:
                self._holder[self._short(key)] = fid
        if len(self._holder) > 2 * len(self.index) + 1024:  # stale entries (fragments left the index)
            self._holder = {k: f for k, f in self._holder.items() if f in self.index}

    # ------------------------------------------------------------------ loading

    def attach(self, vault_index: Any) -> None:
        """Give every live fragment the vector already known for its key (no embedding): from a
        fragment in the index with the same input, from the spares in memory, else (first use, or
        spares trimmed) from the sealed sidecar."""
        with self.lock:
            live = vault_index.live_frag_ids()
            missing = [fid for fid in live if fid not in self.index]
            if len(self.index) > len(live) - len(missing):
                # An embed pass that raced a change may have added a fragment released just after.
                live_set = set(live)
                self.index.remove([fid for fid in self.index.keys() if fid not in live_set])
            if not missing:
                return
            keys = self._keys_of(vault_index, missing)
            first = self._known is None
            if first or self._may_be_sealed(
                [k for k in keys.values() if (self._known is None or k not in self._known) and not self._is_held(k)]
            ):
                t0 = time.perf_counter()
                added = None if _WHOLE_FILE_LOAD else self._stream(keys)
                if added is None:  # the whole-file path: an old-scheme sidecar to re-key (or the benchmark's switch)
                    loaded = self._load(vault_index, keys)
                    added = len(loaded)
                    # Spares only: what the index already holds is not kept twice.
                    self._known = {k: v for k, v in loaded.items() if not self._is_held(k)}
                    self._evicted = np.empty(0, dtype=np.uint64)
                    self._known_partial = False
                log.info("vault %s: loaded %d sealed vectors in %.3f s", vault_index.vault_id, added, time.perf_counter() - t0)
            assert self._known is not None
            missing = [fid for fid in missing if fid not in self.index]
            found: list[tuple[int, str]] = []
            found_vecs = []
            for fid in missing:
                key = keys[fid]
                vec = self._known.get(key)
                if vec is None:
                    vec = self._held(vault_index, key)
                if vec is not None and vec.shape == (self.dims,):
                    found.append((fid, key))
                    found_vecs.append(vec)
            if found:
                check_vector_cap(len(self.index) + len(found), self.dims, self.max_vector_mib, self.index.precision)
                self.index.add([fid for fid, _ in found], found_vecs)  # rows encoded a block at a time: no full copy
                for _, key in found:
                    self._known.pop(key, None)
                self._hold(found)
            self._trim_spares()

    def _keys_of(self, vault_index: Any, frag_ids: Sequence[int]) -> dict[int, str]:
        """Content keys of live fragments (:meth:`key_of`), those the restored snapshot holds in bulk."""
        keeper = getattr(vault_index, "keeper", None)
        known = keeper.content_keys_of(vault_index, frag_ids) if keeper is not None else {}
        return {fid: known[fid] if fid in known else self.key_of(vault_index, fid) for fid in frag_ids}

    def _stream(self, keys: dict[int, str]) -> int | None:
        """Read the sealed sidecar a chunk at a time straight into the index (in its precision, e.g.
        int8), keeping vectors no live fragment wants as spares (bounded): never a float32 copy of the
        whole file. Returns how many sealed vectors were read; None when the file holds old-scheme
        keys (the caller then takes the whole-file path, which re-keys it). A damaged file adds
        nothing (what was added from it is removed again). Caller holds the lock; ``keys`` maps
        the missing fragments to their content keys."""
        wanted: dict[str, list[int]] = {}
        for fid, key in keys.items():
            wanted.setdefault(key, []).append(fid)
        self._known = {}
        self._evicted = np.empty(0, dtype=np.uint64)
        self._known_partial = False
        known = self._known
        added: list[int] = []
        seen = 0
        legacy = False

        pending_fids: list[int] = []
        pending_rows: list[np.ndarray] = []

        def flush() -> None:
            if pending_fids:
                # Encoded as the index holds rows (int8: no float32 copy is kept).
                self.index.add(pending_fids, np.concatenate(pending_rows) if len(pending_rows) > 1 else pending_rows[0])
                added.extend(pending_fids)
                pending_fids.clear()
                pending_rows.clear()

        def take(chunk_keys: list[str], rows: np.ndarray) -> None:
            nonlocal seen, legacy
            seen += len(chunk_keys)
            picks: list[int] = []
            for i, key in enumerate(chunk_keys):
                got = wanted.get(key)
                if got is not None:
                    pending_fids.extend(got)
                    picks.extend([i] * len(got))
                elif is_legacy_key(key):
                    legacy = True
                elif not self._is_held(key):
                    known.pop(key, None)  # a later duplicate wins, and counts as the newest
                    known[key] = np.array(rows[i], dtype=np.float32)  # a copy: rows is a view of the chunk
            if picks:
                pending_rows.append(rows[np.asarray(picks, dtype=np.int64)])
            if len(pending_fids) >= _STREAM_ADD_ROWS:  # a few small chunks (one per embedding batch) at once
                flush()
            if len(known) > self._spare_budget():
                self._trim_spares()

        self.index.reserve(len(self.index) + len(keys))
        try:
            ok = self.sidecar.scan(take)
            if ok:
                flush()
        except BaseException:
            self.index.remove(added)
            self._known = None
            raise
        if legacy or not ok:
            self.index.remove(added)
            self._known = {} if not legacy else None
            self._evicted = np.empty(0, dtype=np.uint64)
            if legacy:
                return None
            return 0
        self._hold([(fid, keys[fid]) for fid in added])
        return seen

    def _load(self, vault_index: Any, keys: dict[int, str]) -> dict[str, np.ndarray]:
        """The sidecar's vectors by content key. A sidecar of the old scheme (fingerprint + title
        keys) is re-keyed here, once: every live fragment's old key is mapped to its content key,
        and the file is rewritten atomically (vectors of no live fragment are left out; nothing is
        re-embedded). Caller holds the lock; ``keys`` are content keys already computed."""
        loaded = self.sidecar.load()
        legacy = sum(1 for k in loaded if is_legacy_key(k))
        if not legacy:
            return loaded
        rename: dict[str, str] = {}
        for fid in vault_index.live_frag_ids():
            doc, frag = vault_index.fragment(fid)
            new = keys.get(fid)
            rename[entry_key(frag.fingerprint, doc.title)] = new if new is not None else self.key_of(vault_index, fid)
        out = rekeyed(loaded, rename)
        try:
            if out:
                self.sidecar.rewrite(out)
            else:
                self.sidecar.discard()
        except MemoriesError as exc:  # the old file stays: re-keyed again at the next load
            log.warning("vault %s: the re-keyed vector cache cannot be written (%s)", vault_index.vault_id, exc.code)
        log.info("vault %s: re-keyed %d sealed vectors to content keys (%d of no live fragment left out)",
                 vault_index.vault_id, legacy, legacy - (len(out) - (len(loaded) - legacy)))
        return out

    def _spare_budget(self) -> int:
        return int(self.max_vector_mib * 1024 * 1024 * SPARE_SHARE) // max(1, self.dims * 4)

    def _trim_spares(self) -> None:
        """Keep at most SPARE_SHARE of ``max_vector_mib`` of spare vectors (the newest)."""
        if self._known is None:
            return
        budget = self._spare_budget()
        if len(self._known) > budget:
            drop = len(self._known) - budget
            gone = list(itertools.islice(self._known, drop))
            for k in gone:
                del self._known[k]
            self._evicted = np.union1d(self._evicted, _key_hashes(gone))

    def _may_be_sealed(self, keys: Sequence[str]) -> bool:
        """Whether the sidecar may hold a vector for one of ``keys`` that memory does not."""
        if not keys:
            return False
        if self._known_partial:
            return True
        return bool(self._evicted.size) and bool(np.isin(_key_hashes(keys), self._evicted, assume_unique=False).any())

    @property
    def spare_count(self) -> int:
        return 0 if self._known is None else len(self._known)

    def drop(self, frag_ids: Sequence[int], keys: Sequence[str] | None = None) -> None:
        """Forget fragments that left the index; with their content ``keys``, their vectors become
        spares (bounded) for a fragment that comes back."""
        with self.lock:
            if keys is not None:
                for fid, key in zip(frag_ids, keys, strict=True):
                    if self._holder.get(self._short(key)) == fid:
                        del self._holder[self._short(key)]
                    vec = self.index.get(fid) if self._known is not None else None
                    if vec is not None and self._known is not None:
                        self._known.pop(key, None)
                        self._known[key] = np.array(vec, dtype=np.float32)
            else:
                self._known_partial = True
            self.index.remove(frag_ids)
            self._trim_spares()

    def retain(self, keep: Collection[str], rename: dict[str, str] | None = None) -> tuple[int, int] | None:
        """Compaction: keep only vectors whose content key is in ``keep``, on disk and among the
        known ones in memory (the index itself holds only live fragments). ``rename`` re-keys a
        sidecar of the old scheme that was not loaded yet."""
        with self.lock:
            result = self.sidecar.retain(keep, rename)
            if self._known is not None:
                self._known = {k: v for k, v in self._known.items() if k in keep}
            return result

    def missing(self, vault_index: Any) -> list[int]:
        """Live fragments without a vector, except those recorded as skipped (cannot be embedded)."""
        with self.lock:
            out = [fid for fid in vault_index.live_frag_ids() if fid not in self.index]
            if self.skipped:
                out = [fid for fid in out if (got := vault_index.get_fragment(fid)) is not None
                       and self._input_key(*got)[1] not in self.skipped]
            return out

    # ------------------------------------------------------------------ embedding

    def embed(
        self,
        vault_index: Any,
        frag_ids: Sequence[int],
        embed_fn: Callable[[list[tuple[str | None, str]]], np.ndarray],
        *,
        check: Callable[[], None],
        deadline: float | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Embed ``frag_ids`` in batches; each finished batch is sealed to disk and added.

        The model reads each distinct input once: a fragment whose content key already has a vector
        (in the index, among the spares, or earlier in the pass) reuses it. ``check()`` runs before
        each batch and before each batch is kept (lock, vault change, client gone); ``deadline``
        (monotonic) ends the pass between batches. Returns how many fragments got a vector.
        """
        done = 0
        check_vector_cap(len(self.index) + len(frag_ids), self.dims, self.max_vector_mib, self.index.precision)
        for start in range(0, len(frag_ids), BATCH_FRAGMENTS):
            if deadline is not None and time.monotonic() >= deadline:
                break
            check()
            batch: list[int] = []
            keys: list[str] = []
            todo: dict[str, tuple[str | None, str]] = {}  # distinct inputs without a vector
            reuse: dict[str, np.ndarray] = {}
            with self.lock:
                for fid in frag_ids[start : start + BATCH_FRAGMENTS]:
                    got = vault_index.get_fragment(fid)
                    if got is None:  # its record changed since the pass began: nothing to embed
                        continue
                    item, key = self._input_key(*got)
                    batch.append(fid)
                    keys.append(key)
                    if key in reuse or key in todo:
                        continue
                    vec = self._held(vault_index, key)
                    if vec is None and self._known is not None:
                        vec = self._known.get(key)
                    if vec is not None:
                        reuse[key] = vec
                    else:
                        todo[key] = item
            if not batch:
                continue
            rows = self._embed_batch(embed_fn, list(todo.values()), check) if todo else []
            check()  # a lock or change while the batch ran: discard it
            with self.lock:
                new: dict[str, np.ndarray] = {}
                for key, v in zip(todo, rows, strict=True):
                    if v is None:
                        self.skipped.add(key)
                        log.warning("vault %s: a fragment could not be embedded; it is skipped (still found by bm25)",
                                    vault_index.vault_id)
                    else:
                        new[key] = v
                if new:
                    self.sidecar.append(new)
                live: list[tuple[int, str]] = []
                live_vecs = []
                kept = 0
                for fid, key in zip(batch, keys, strict=True):
                    v = new.get(key)
                    if v is None:
                        v = reuse.get(key)
                    if v is None:
                        continue
                    kept += 1
                    if vault_index.get_fragment(fid) is not None:  # live now: not a spare
                        if self._known is not None:
                            self._known.pop(key, None)
                        if fid not in self.index:
                            live.append((fid, key))
                            live_vecs.append(v)
                    elif key in new and self._known is not None:  # its record changed meanwhile: a spare
                        self._known.pop(key, None)
                        self._known[key] = v
                if live:
                    self.index.add([f for f, _ in live], np.stack(live_vecs))
                    self._hold(live)
                self._trim_spares()
            done += kept
            if on_batch is not None:
                on_batch(done)
        return done

    def _embed_batch(
        self,
        embed_fn: Callable[[list[tuple[str | None, str]]], np.ndarray],
        items: list[tuple[str | None, str]],
        check: Callable[[], None],
    ) -> list[np.ndarray | None]:
        """One vector per item, or None for an item the model cannot embed.

        A batch the model fails on is retried item by item, so one bad fragment (a token the graph
        rejects, an invalid output) costs only itself, never the batch, the pass or later searches.
        """
        try:
            out = embed_fn(items)
        except ModelInputFailed:
            out = None
        if out is not None:  # a wrong shape is the service's or model's fault, not one fragment's: raised
            return list(self._checked(out, len(items)))
        if len(items) == 1:
            return [None]
        rows: list[np.ndarray | None] = []
        for item in items:
            check()
            try:
                one = embed_fn([item])
            except ModelInputFailed:
                rows.append(None)
                continue
            rows.append(self._checked(one, 1)[0])
        return rows

    def _checked(self, out: Any, n: int) -> np.ndarray:
        vecs = np.asarray(out, dtype=np.float32)
        if vecs.shape != (n, self.dims):
            raise InvalidModelOutput(f"the embedder returned {vecs.shape} vectors for {n} fragments of {self.dims} dimensions")
        if not np.all(np.isfinite(vecs)):
            raise InvalidModelOutput("the embedder returned a vector that is not finite")
        return vecs

    def search(self, query: np.ndarray, k: int, allowed: Any = None, min_score: float | None = None) -> list[tuple[int, float]]:
        with self.lock:
            if len(self.index) == 0:
                return []
            return self.index.search(query, k, allowed=allowed, min_score=min_score)

    @property
    def nbytes(self) -> int:
        """Vectors held in memory: the index and the spares."""
        return int(self.index.nbytes) + self.spare_count * self.dims * 4

    def close(self) -> None:
        with self.lock:
            self.index.clear()
            self._known = None
            self._holder = {}
            self._evicted = np.empty(0, dtype=np.uint64)
            self._sealer.wipe()
            crypto.wipe(self._fp_key)


__all__ = ["VectorSpace", "Cancelled", "CapExceeded", "compact_vectors", "sealed_status", "sidecar_id"]
