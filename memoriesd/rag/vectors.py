"""Vectors of one vault for one embedder identity: in memory, and sealed at rest.

Each vector is bound to its fragment's fingerprint, its record's title and the embedder's
identity (the sidecar's associated data), so a different model, prompt or title never reuses a
vector. Unlock or restart reload vectors from the sealed sidecar instead of re-embedding; vault
changes embed only fragments whose key is new.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import Cancelled, CapExceeded
from ..index.vector_store import VectorStore, entry_key, sidecar_path
from ..index.vectors import VectorIndex, check_vector_cap
from ..vault import crypto

log = logging.getLogger("memoriesd.vectors")
BATCH_FRAGMENTS = 32


def sidecar_id(vault_key: bytes | bytearray, identity: str) -> str:
    key = crypto.subkey(vault_key, crypto.LABEL_VECTOR_NAMES)
    try:
        return crypto.mac(key, identity.encode("utf-8")).hex()[:32]
    finally:
        crypto.wipe(key)


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
        self._known: dict[str, np.ndarray] | None = None  # sealed + recently dropped vectors by entry key
        self.lock = threading.RLock()

    @staticmethod
    def key_of(vault_index: Any, frag_id: int) -> str:
        doc, frag = vault_index.fragment(frag_id)
        return entry_key(frag.fingerprint, doc.title)

    def attach(self, vault_index: Any) -> None:
        """Give every live fragment the vector already known for its key (no embedding)."""
        with self.lock:
            live = vault_index.live_frag_ids()
            missing = [fid for fid in live if fid not in self.index]
            if not missing:
                return
            if self._known is None:
                t0 = time.perf_counter()
                self._known = self.sidecar.load()
                log.info("vault %s: loaded %d sealed vectors in %.3f s", vault_index.vault_id, len(self._known), time.perf_counter() - t0)
            found_ids, found_vecs = [], []
            for fid in missing:
                vec = self._known.get(self.key_of(vault_index, fid))
                if vec is not None and vec.shape == (self.dims,):
                    found_ids.append(fid)
                    found_vecs.append(vec)
            if found_ids:
                check_vector_cap(len(self.index) + len(found_ids), self.dims, self.max_vector_mib)
                self.index.add(found_ids, np.stack(found_vecs).astype(np.float32))

    def drop(self, frag_ids: Sequence[int]) -> None:
        """Forget fragments that left the index (their vectors stay known by key for reuse)."""
        with self.lock:
            self.index.remove(frag_ids)

    def missing(self, vault_index: Any) -> list[int]:
        with self.lock:
            return [fid for fid in vault_index.live_frag_ids() if fid not in self.index]

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
            batch = list(frag_ids[start : start + BATCH_FRAGMENTS])
            items: list[tuple[str | None, str]] = []
            keys = []
            for fid in batch:
                doc, frag = vault_index.fragment(fid)
                items.append((doc.title or None, frag.text))
                keys.append(entry_key(frag.fingerprint, doc.title))
            vecs = np.asarray(embed_fn(items), dtype=np.float32)
            if vecs.shape != (len(batch), self.dims):
                from ..errors import InvalidModelOutput

                raise InvalidModelOutput(
                    f"the embedder returned {vecs.shape} vectors for {len(batch)} fragments of {self.dims} dimensions"
                )
            check()  # a lock or change while the batch ran: discard it
            with self.lock:
                self.sidecar.append(dict(zip(keys, vecs, strict=True)))
                if self._known is not None:
                    self._known.update(zip(keys, vecs, strict=True))
                live = [(fid, v) for fid, v in zip(batch, vecs, strict=True) if fid not in self.index]
                if live:
                    self.index.add([f for f, _ in live], np.stack([v for _, v in live]))
            done += len(batch)
            if on_batch is not None:
                on_batch(done)
        return done

    def search(self, query: np.ndarray, k: int, allowed: Any = None, min_score: float | None = None) -> list[tuple[int, float]]:
        with self.lock:
            if len(self.index) == 0:
                return []
            return self.index.search(query, k, allowed=allowed, min_score=min_score)

    @property
    def nbytes(self) -> int:
        return int(self.index.nbytes)

    def close(self) -> None:
        with self.lock:
            self.index.clear()
            self._known = None
            self._sealer.wipe()


__all__ = ["VectorSpace", "Cancelled", "CapExceeded", "sidecar_id"]
