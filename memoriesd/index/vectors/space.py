"""Vectors of one vault for one embedder identity: in memory, and sealed at rest.

Each vector is keyed by its content: a keyed hash of exactly what the model reads (the record's
title or none, and the fragment's text; :func:`~memoriesd.index.vectors.names.content_key`), bound
to the embedder's identity (the sidecar's associated data), so a different model, prompt or title
never reuses a vector, while the same input does wherever it is: an edit near the top of a note
re-embeds only the fragments whose text changed (byte offsets are not part of the key; results
still carry them from the fragment), and a passage in two notes has one vector. Unlock or restart
reload vectors from the sealed sidecar instead of re-embedding: its rows are sealed in the index's
precision (int8 by default), so a chunk at a time they are matched in bulk to the content keys the
restored lexical snapshot holds and copied in as stored (:mod:`~memoriesd.index.vectors.load`);
vault changes embed only fragments whose key is new. A sidecar of the old scheme (keys from the
fragment fingerprint and title) is re-keyed once on attach and rewritten, without re-embedding; a
version-1 sidecar (float32 rows) is rewritten once in the index's precision. Vectors kept for reuse
outside the index (spares, and the fragment holding each key) are in
:mod:`~memoriesd.index.vectors.spares`. Whole-vault functions
(``vault compact``'s :func:`compact_vectors`, ``rag status``'s :func:`sealed_status`) are in
:mod:`~memoriesd.index.vectors.maintenance`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from ...errors import InvalidModelOutput, MemoriesError, ModelInputFailed
from ...text.fragments import Fragment
from ...vault import crypto
from ..docs import IndexedDoc, embed_input
from .chunks import CONTENT_KEY_HEX, encoding_of_precision
from .load import SidecarMatch, key_arrays
from .maintenance import (
    register_space,
    sidecar_id,
)
from .matrix import VectorIndex, check_vector_cap
from .names import content_key, entry_key, is_legacy_key, rekeyed, sidecar_path
from .rewrite import repack_after_load, retain
from .sidecar import VectorStore
from .spares import Holders, Spares
from .windows import search_with_windows

if TYPE_CHECKING:
    from ...config import CacheConfig
    from ...text.fragments import Fragment
    from ...vault.store import VaultStore
    from ..docs import IndexedDoc


class IndexedFragments(Protocol):
    """What a vector space reads of its vault's index (:class:`memoriesd.index.caches.VaultIndex`,
    which holds the space: named by this Protocol so that the two import no circle)."""

    @property
    def store(self) -> VaultStore: ...

    @property
    def vault_id(self) -> str: ...

    @property
    def cache_cfg(self) -> CacheConfig: ...

    def fragment(self, frag_id: int) -> tuple[IndexedDoc, Fragment]: ...

    def get_fragment(self, frag_id: int) -> tuple[IndexedDoc, Fragment] | None: ...

    def live_frag_ids(self) -> list[int]: ...

    def live_vector_ids(self, windows: bool) -> list[int]: ...

log = logging.getLogger("memoriesd.vectors")
BATCH_FRAGMENTS = 32
#: Benchmark switch only (``bench/bench_first_search.py`` measures before/after in one run): load
#: the sidecar whole, decoded to float32, as before streaming. Never set it otherwise.
_WHOLE_FILE_LOAD = os.environ.get("MEMORIES_BENCH_WHOLE_FILE_VECTORS") == "1"


class VectorSpace:
    """The vectors of one :class:`~memoriesd.index.caches.VaultIndex` under one embedder."""

    def __init__(self, vault_index: IndexedFragments, identity: str, dims: int, max_vector_mib: float, *, windows: bool = True) -> None:
        store = vault_index.store
        self.identity = identity
        self.windows = windows  # also a vector per turn window of conversation fragments (kinds.turns.turn_windows)
        self.dims = dims
        self.max_vector_mib = max_vector_mib
        self._sealer = store.keys.sealer(crypto.LABEL_VECTORS)
        self._fp_key = store.keys.subkey(crypto.LABEL_FINGERPRINT)  # keys vectors by content
        self.sidecar = VectorStore(
            sidecar_path(store.dir, sidecar_id(store.keys, identity)),
            vault_id=store.vault_id,
            identity=identity,
            dims=dims,
            seal=self._sealer.seal,
            open_=self._sealer.open,
            encoding=encoding_of_precision(vault_index.cache_cfg.vector_precision),  # rows sealed as held
        )
        self.index = VectorIndex(dims, max_vector_mib=max_vector_mib, precision=vault_index.cache_cfg.vector_precision)
        self.skipped: set[str] = set()  # content keys of fragments the model cannot embed (this unlock)
        # Spare vectors (no live fragment uses them now) and the fragment holding each content key,
        # so a key that comes back reuses its vector (:mod:`memoriesd.index.vectors.spares`).
        self.spares = Spares(dims, max_vector_mib)
        self.holders = Holders(self.index)
        self.lock = threading.RLock()
        self._repacker: threading.Thread | None = None  # the background rewrite after a load (repack_after_load)
        register_space(store, self._sealer, identity, dims)

    # ------------------------------------------------------------------ keys

    def key_of(self, vault_index: IndexedFragments, frag_id: int) -> str:
        """The content key of a live fragment's vector (see the module docstring): the one the
        restored lexical snapshot holds when it has it (computing it costs about 9 µs of CPU here,
        0.9 s per 100,000 fragments at the first vector search after unlock), else computed."""
        doc, frag = vault_index.fragment(frag_id)
        keeper = getattr(vault_index, "keeper", None)
        if keeper is not None:
            key: str | None = keeper.content_key_for(doc, frag)
            if key is not None:
                return key
        return self._input_key(doc, frag)[1]

    def _input_key(self, doc: IndexedDoc, frag: Fragment) -> tuple[tuple[str | None, str], str]:
        """What the embedder reads for the fragment, and its content key."""
        if getattr(self._fp_key, "wiped", False):
            raise crypto.KeyWiped("the fingerprint key was wiped (the vault was locked)")
        title, text = embed_input(doc, frag)
        return (title, text), content_key(self._fp_key, title, text)

    def _held(self, vault_index: IndexedFragments, key: str) -> np.ndarray | None:
        """The vector of ``key`` if a fragment in the index has exactly that key."""
        fid = self.holders.holder(key)
        if fid is None:
            return None
        got = vault_index.get_fragment(fid)
        if got is None or self._input_key(*got)[1] != key:
            return None
        return self.index.get(fid)

    # ------------------------------------------------------------------ loading

    def attach(self, vault_index: IndexedFragments) -> None:
        """Give every live fragment the vector already known for its key (no embedding): from a
        fragment in the index with the same input, from the spares in memory, else (first use, or
        spares trimmed) from the sealed sidecar."""
        with self.lock:
            live = vault_index.live_vector_ids(self.windows)
            missing = self.index.absent(live) if len(self.index) else live
            if len(self.index) > len(live) - len(missing):
                # An embed pass that raced a change may have added a fragment released just after.
                live_set = set(live)
                self.index.remove([fid for fid in self.index.keys() if fid not in live_set])
            if not missing:
                return
            first = self.spares.vecs is None
            # The first load asks for every live fragment: their keys in bulk, as arrays.
            bulk = self._bulk_keys(vault_index, missing) if first and not _WHOLE_FILE_LOAD else None
            keys = self._keys_of(vault_index, missing) if bulk is None else None
            if first or self.spares.may_be_sealed(
                [k for k in (keys or {}).values() if self.spares.get(k) is None and not self.holders.is_held(k)]
            ):
                t0 = time.perf_counter()
                added = None if _WHOLE_FILE_LOAD else self._stream(bulk if bulk is not None else key_arrays(keys or {}))
                if added is None:  # the whole-file path: an old-scheme sidecar to re-key (or the benchmark's switch)
                    if keys is None:
                        keys = self._keys_of(vault_index, missing)
                    loaded = self._load(vault_index, keys)
                    added = len(loaded)
                    # Spares only: what the index already holds is not kept twice.
                    self.spares.start({k: v for k, v in loaded.items() if not self.holders.is_held(k)})
                log.info("vault %s: loaded %d sealed vectors in %.3f s", vault_index.vault_id, added, time.perf_counter() - t0)
            assert self.spares.vecs is not None
            missing = self.index.absent(missing)
            if not missing:
                self.spares.trim()
                return
            if keys is None:
                keys = self._keys_of(vault_index, missing)
            found: list[tuple[int, str]] = []
            found_vecs = []
            for fid in missing:
                key = keys[fid]
                vec = self.spares.get(key)
                if vec is None:
                    vec = self._held(vault_index, key)
                if vec is not None and vec.shape == (self.dims,):
                    found.append((fid, key))
                    found_vecs.append(vec)
            if found:
                check_vector_cap(len(self.index) + len(found), self.dims, self.max_vector_mib, self.index.precision)
                self.index.add([fid for fid, _ in found], found_vecs)  # rows encoded a block at a time: no full copy
                for _, key in found:
                    self.spares.take(key)
                self.holders.hold(found)
            self.spares.trim()

    def _bulk_keys(self, vault_index: IndexedFragments, missing: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(fids, S32 content keys)`` of ``missing`` (every live fragment, at the first load):
        those the restored snapshot holds taken in bulk, the others computed."""
        keeper = getattr(vault_index, "keeper", None)
        fids, joined = keeper.content_key_runs(vault_index) if keeper is not None else ([], "")
        if len(fids) == len(missing) and not len(self.index):  # all of them (the usual case)
            return np.asarray(fids, dtype=np.int64), np.frombuffer(joined.encode("ascii"), dtype=f"S{CONTENT_KEY_HEX}")
        want = set(missing)
        pairs = [(f, joined[i * CONTENT_KEY_HEX : (i + 1) * CONTENT_KEY_HEX]) for i, f in enumerate(fids) if f in want]
        have = {f for f, _ in pairs}
        pairs += [(f, self.key_of(vault_index, f)) for f in missing if f not in have]
        return key_arrays(dict(pairs))

    def _keys_of(self, vault_index: IndexedFragments, frag_ids: Sequence[int]) -> dict[int, str]:
        """Content keys of live fragments (:meth:`key_of`), those the restored snapshot holds in bulk."""
        keeper = getattr(vault_index, "keeper", None)
        known = keeper.content_keys_of(vault_index, frag_ids) if keeper is not None else {}
        return {fid: known[fid] if fid in known else self.key_of(vault_index, fid) for fid in frag_ids}

    def _stream(self, keys: tuple[np.ndarray, np.ndarray]) -> int | None:
        """Read the sealed sidecar a chunk at a time straight into the index: rows stored in the
        index's precision (int8 by default) are copied as they are, matched to fragments in bulk
        (:class:`~memoriesd.index.vectors.load.SidecarMatch`); vectors no live fragment wants are
        kept as spares (bounded). Returns how many sealed vectors were read; None when the file
        holds old-scheme keys (the caller then takes the whole-file path, which re-keys it). A
        damaged file adds nothing. A file with rows wider than the index's (version 1, or another
        precision) is rewritten once in the index's encoding. Caller holds the lock; ``keys``: the
        missing fragments and their content keys (:func:`~memoriesd.index.vectors.load.key_arrays`)."""
        known = self.spares.start()

        def spare(chunk_keys: list[str], rows: np.ndarray) -> None:
            for key, row in zip(chunk_keys, rows, strict=True):
                if not is_legacy_key(key) and not self.holders.is_held(key):
                    known.pop(key, None)  # a later duplicate wins, and counts as the newest
                    known[key] = row
            if len(known) > self.spares.budget:
                self.spares.trim()

        match = SidecarMatch(keys, self.dims, self.index.precision, spare)
        ok = self.sidecar.scan_chunks(match.take)
        if match.legacy or not ok:
            self.spares.start()
            if match.legacy:
                self.spares.vecs = None
            return None if match.legacy else 0
        got = match.result()
        if got.fids:
            check_vector_cap(len(self.index) + len(got.fids), self.dims, self.max_vector_mib, self.index.precision)
            self.index.add_encoded(got.fids, self.index.precision, got.rows, got.scales, adopt=True)
            self.holders.hold_arrays(got.pair_fids, got.pair_keys)
        if self.sidecar.needs_repack and self._repacker is None:
            # In the background, after the load that answers the search; close() (lock) waits for it.
            self._repacker = threading.Thread(target=repack_after_load, args=(self.sidecar,), name="memoriesd-vecrepack", daemon=True)
            self._repacker.start()
        return got.seen

    def _load(self, vault_index: IndexedFragments, keys: dict[int, str]) -> dict[str, np.ndarray]:
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

    @property
    def spare_count(self) -> int:
        return self.spares.count

    def drop(self, frag_ids: Sequence[int], keys: Sequence[str] | None = None) -> None:
        """Forget fragments that left the index; with their content ``keys``, their vectors become
        spares (bounded) for a fragment that comes back."""
        with self.lock:
            if keys is not None:
                for fid, key in zip(frag_ids, keys, strict=True):
                    self.holders.release(fid, key)
                    vec = self.index.get(fid) if self.spares.vecs is not None else None
                    if vec is not None:
                        self.spares.put(key, np.array(vec, dtype=np.float32))
            else:
                self.spares.partial = True
            self.index.remove(frag_ids)
            self.spares.trim()

    def retain(self, keep: Collection[str], rename: dict[str, str] | None = None) -> tuple[int, int] | None:
        """Compaction: keep only vectors whose content key is in ``keep``, on disk and among the
        known ones in memory (the index itself holds only live fragments). ``rename`` re-keys a
        sidecar of the old scheme that was not loaded yet."""
        with self.lock:
            result = retain(self.sidecar, keep, rename)
            self.spares.keep_only(keep)
            return result

    def missing(self, vault_index: IndexedFragments) -> list[int]:
        """Live fragments without a vector, except those recorded as skipped (cannot be embedded)."""
        with self.lock:
            out = self.index.absent(vault_index.live_vector_ids(self.windows))
            if self.skipped:
                out = [fid for fid in out if (got := vault_index.get_fragment(fid)) is not None
                       and self._input_key(*got)[1] not in self.skipped]
            return out

    # ------------------------------------------------------------------ embedding

    def embed(
        self,
        vault_index: IndexedFragments,
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
                    if vec is None:
                        vec = self.spares.get(key)
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
                        self.spares.take(key)
                        if fid not in self.index:
                            live.append((fid, key))
                            live_vecs.append(v)
                    elif key in new:  # its record changed meanwhile: a spare
                        self.spares.put(key, v)
                if live:
                    self.index.add([f for f, _ in live], np.stack(live_vecs))
                    self.holders.hold(live)
                self.spares.trim()
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

    def _checked(self, out: npt.ArrayLike, n: int) -> np.ndarray:
        vecs = np.asarray(out, dtype=np.float32)
        if vecs.shape != (n, self.dims):
            raise InvalidModelOutput(f"the embedder returned {vecs.shape} vectors for {n} fragments of {self.dims} dimensions")
        if not np.all(np.isfinite(vecs)):
            raise InvalidModelOutput("the embedder returned a vector that is not finite")
        return vecs

    def search(
        self,
        query: np.ndarray,
        k: int,
        allowed: Collection[int] | None = None,
        min_score: float | None = None,
        *,
        windows: bool = False,
        best_windows: dict[int, int] | None = None,
    ) -> list[tuple[int, float]]:
        """Top ``k`` ``(fragment id, cosine)``. ``windows``: a conversation fragment scores its own
        cosine lifted by its best turn window (:mod:`memoriesd.index.vectors.windows`), as the
        answering surfaces (``rag context``, ``rag ask``) rank, and ``best_windows`` receives
        which window that was; else its own cosine alone."""
        with self.lock:
            if len(self.index) == 0:
                return []
            if self.index.negative_keys and windows:
                return search_with_windows(self.index, query, k, allowed=allowed, min_score=min_score,
                                           best_windows=best_windows)
            return self.index.search(query, k, allowed=allowed, min_score=min_score, skip_negative=True)

    @property
    def nbytes(self) -> int:
        """Vectors held in memory: the index and the spares."""
        return int(self.index.nbytes) + self.spare_count * self.dims * 4

    def close(self) -> None:
        repacker = self._repacker
        if repacker is not None and repacker.is_alive():
            t0 = time.perf_counter()
            repacker.join(timeout=120)
            log.info("vector cache %s: lock waited %.2f s for its rewrite", self.sidecar.path.name, time.perf_counter() - t0)
        with self.lock:
            self.index.clear()
            self.spares.clear()
            self.holders.clear()
            self._sealer.wipe()
            crypto.wipe(self._fp_key)


__all__ = ["VectorSpace"]
