"""Vectors of one vault for one embedder identity: in memory, and sealed at rest.

Each vector is bound to its fragment's fingerprint, its record's title and the embedder's
identity (the sidecar's associated data), so a different model, prompt or title never reuses a
vector. Unlock or restart reload vectors from the sealed sidecar instead of re-embedding; vault
changes embed only fragments whose key is new. ``vault compact`` rewrites every sidecar the vault's
space list knows to the vectors of live fragments (:func:`compact_vectors`); ``rag status`` counts
sealed vectors before they are loaded (:func:`sealed_status`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from ..errors import Cancelled, CapExceeded, InvalidModelOutput, ModelInputFailed
from ..index.caches import embed_input
from ..index.vector_store import (
    VectorStore,
    entry_key,
    list_sidecars,
    read_spaces,
    sidecar_opaque_id,
    sidecar_path,
    write_spaces,
)
from ..index.vectors import VectorIndex, check_vector_cap, vector_bytes
from ..vault import crypto

log = logging.getLogger("memoriesd.vectors")
BATCH_FRAGMENTS = 32
#: Spare vectors (not used by a live fragment) kept in memory, as a share of max_vector_mib.
SPARE_SHARE = 0.25


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


def live_fragment_keys(store: Any) -> list[str]:
    """The entry key of every fragment of the vault's live, searchable records (one per fragment),
    computed exactly as the index does (same fragments, same fingerprint subkey); builds no index."""
    from ..index.caches import index_doc

    fp_key = crypto.subkey(store.key, crypto.LABEL_FINGERPRINT)
    try:
        key = bytes(fp_key)
        return [
            entry_key(frag.fingerprint, rec.title)
            for rec in store.latest()
            if rec.searchable
            for frag in index_doc(rec, key).fragments
        ]
    finally:
        crypto.wipe(fp_key)


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
            keep = set(live_fragment_keys(store))  # raises VaultLocked when locked meanwhile
            sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
            try:
                spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
                for path in list_sidecars(store.dir):
                    if space is not None and path == space.sidecar.path:
                        result = space.retain(keep)
                    elif sidecar_opaque_id(path) in spaces:
                        entry = spaces[sidecar_opaque_id(path)]
                        result = VectorStore(
                            path,
                            vault_id=store.vault_id,
                            identity=str(entry["identity"]),
                            dims=int(str(entry["dims"])),
                            seal=sealer.seal,
                            open_=sealer.open,
                        ).retain(keep)
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
    frag_keys = live_fragment_keys(store)
    embedded = sum(1 for k in frag_keys if k in keys)
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
        self.sidecar = VectorStore(
            sidecar_path(store.dir, sidecar_id(store.key, identity)),
            vault_id=store.vault_id,
            identity=identity,
            dims=dims,
            seal=self._sealer.seal,
            open_=self._sealer.open,
        )
        self.index = VectorIndex(dims, max_vector_mib=max_vector_mib)
        self.skipped: set[str] = set()  # entry keys of fragments the model cannot embed (this unlock)
        # Spare vectors by entry key: sealed or recently dropped ones that no live fragment uses now
        # (kept for a fragment that comes back, e.g. an edit undone). Never the live ones (the index
        # holds those), and at most SPARE_SHARE of max_vector_mib; None until the sidecar is read.
        self._known: dict[str, np.ndarray] | None = None
        # Sealed vectors held neither by the index nor as spares (trimmed): 8-byte hashes of their
        # keys, sorted, so attach() re-reads the sidecar only for a key it may hold, not for every
        # new text. A superset is harmless (one needless read); unknown (drop() without keys) is
        # _known_partial, which re-reads on any miss.
        self._evicted = np.empty(0, dtype=np.uint64)
        self._known_partial = False
        self.lock = threading.RLock()
        register_space(store, self._sealer, identity, dims)

    @staticmethod
    def key_of(vault_index: Any, frag_id: int) -> str:
        doc, frag = vault_index.fragment(frag_id)
        return entry_key(frag.fingerprint, doc.title)

    def attach(self, vault_index: Any) -> None:
        """Give every live fragment the vector already known for its key (no embedding): from the
        spares in memory, else (first use, or spares trimmed) from the sealed sidecar."""
        with self.lock:
            live = vault_index.live_frag_ids()
            missing = [fid for fid in live if fid not in self.index]
            if len(self.index) > len(live) - len(missing):
                # An embed pass that raced a change may have added a fragment released just after.
                live_set = set(live)
                self.index.remove([fid for fid in self.index.keys() if fid not in live_set])
            if not missing:
                return
            keys = {fid: self.key_of(vault_index, fid) for fid in missing}
            if self._known is None or self._may_be_sealed([k for k in keys.values() if k not in self._known]):
                t0 = time.perf_counter()
                loaded = self.sidecar.load()
                log.info("vault %s: loaded %d sealed vectors in %.3f s", vault_index.vault_id, len(loaded), time.perf_counter() - t0)
                # Spares only: what the index already holds is not kept twice.
                in_index = {self.key_of(vault_index, fid) for fid in live if fid in self.index}
                self._known = {k: v for k, v in loaded.items() if k not in in_index}
                self._evicted = np.empty(0, dtype=np.uint64)
                self._known_partial = False
            found_ids, found_vecs = [], []
            for fid in missing:
                vec = self._known.get(keys[fid])
                if vec is not None and vec.shape == (self.dims,):
                    found_ids.append(fid)
                    found_vecs.append(vec)
            if found_ids:
                check_vector_cap(len(self.index) + len(found_ids), self.dims, self.max_vector_mib)
                self.index.add(found_ids, np.stack(found_vecs).astype(np.float32))
                for fid in found_ids:
                    self._known.pop(keys[fid], None)
            self._trim_spares()

    def _trim_spares(self) -> None:
        """Keep at most SPARE_SHARE of ``max_vector_mib`` of spare vectors (the newest)."""
        if self._known is None:
            return
        budget = int(self.max_vector_mib * 1024 * 1024 * SPARE_SHARE) // max(1, self.dims * 4)
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
        """Forget fragments that left the index; with their entry ``keys``, their vectors become
        spares (bounded) for a fragment that comes back."""
        with self.lock:
            if keys is not None and self._known is not None:
                for fid, key in zip(frag_ids, keys, strict=True):
                    vec = self.index.get(fid)
                    if vec is not None:
                        self._known.pop(key, None)
                        self._known[key] = np.array(vec, dtype=np.float32)
            elif keys is None:
                self._known_partial = True
            self.index.remove(frag_ids)
            self._trim_spares()

    def retain(self, keep: Collection[str]) -> tuple[int, int] | None:
        """Compaction: keep only vectors whose entry key is in ``keep``, on disk and among the
        known ones in memory (the index itself holds only live fragments)."""
        with self.lock:
            result = self.sidecar.retain(keep)
            if self._known is not None:
                self._known = {k: v for k, v in self._known.items() if k in keep}
            return result

    def missing(self, vault_index: Any) -> list[int]:
        """Live fragments without a vector, except those recorded as skipped (cannot be embedded)."""
        with self.lock:
            out = [fid for fid in vault_index.live_frag_ids() if fid not in self.index]
            if self.skipped:
                out = [fid for fid in out if (got := vault_index.get_fragment(fid)) is not None
                       and entry_key(got[1].fingerprint, got[0].title) not in self.skipped]
            return out

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

        ``check()`` runs before each batch and before each batch is kept (lock, vault change, client
        gone); ``deadline`` (monotonic) ends the pass between batches. Returns how many were embedded.
        """
        done = 0
        check_vector_cap(len(self.index) + len(frag_ids), self.dims, self.max_vector_mib)
        for start in range(0, len(frag_ids), BATCH_FRAGMENTS):
            if deadline is not None and time.monotonic() >= deadline:
                break
            check()
            batch = []
            items: list[tuple[str | None, str]] = []
            keys = []
            for fid in frag_ids[start : start + BATCH_FRAGMENTS]:
                got = vault_index.get_fragment(fid)
                if got is None:  # its record changed since the pass began: nothing to embed
                    continue
                doc, frag = got
                batch.append(fid)
                items.append(embed_input(doc, frag))
                keys.append(entry_key(frag.fingerprint, doc.title))
            if not batch:
                continue
            rows = self._embed_batch(embed_fn, items, check)
            check()  # a lock or change while the batch ran: discard it
            kept = [(fid, key, v) for fid, key, v in zip(batch, keys, rows, strict=True) if v is not None]
            with self.lock:
                for key, v in zip(keys, rows, strict=True):
                    if v is None:
                        self.skipped.add(key)
                        log.warning("vault %s: a fragment could not be embedded; it is skipped (still found by bm25)",
                                    vault_index.vault_id)
                if kept:
                    self.sidecar.append({key: v for _, key, v in kept})
                    live = []
                    for fid, key, v in kept:
                        if vault_index.get_fragment(fid) is not None:  # live now: not a spare
                            if self._known is not None:
                                self._known.pop(key, None)
                            if fid not in self.index:
                                live.append((fid, v))
                        elif self._known is not None:  # its record changed meanwhile: a spare
                            self._known.pop(key, None)
                            self._known[key] = v
                    if live:
                        self.index.add([f for f, _ in live], np.stack([v for _, v in live]))
                    self._trim_spares()
            done += len(kept)
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
            self._evicted = np.empty(0, dtype=np.uint64)
            self._sealer.wipe()


__all__ = ["VectorSpace", "Cancelled", "CapExceeded", "compact_vectors", "sealed_status", "sidecar_id"]
