"""What a vector space keeps for reuse besides its index: spare vectors, and which fragment holds a key.

A :class:`~memoriesd.index.vectors.space.VectorSpace` reuses a vector wherever its content key
comes back, without reading the sealed sidecar or embedding again:

- :class:`Spares`: vectors by content key that no live fragment uses now (read from the sidecar
  for no fragment, or dropped by an edit), kept for a fragment that comes back (an edit undone),
  newest last and at most ``SPARE_SHARE`` of ``max_vector_mib``. The ones trimmed away are kept as
  sorted 8-byte hashes of their keys, so ``attach`` re-reads the sidecar only for a key it may hold,
  not for every new text (a superset is harmless: one needless read). Never the live vectors: the
  index holds those.
- :class:`Holders`: a content key's first 64 bits -> a fragment in the index with that vector, so a
  fragment with the same model input (a passage in two notes) reuses it; a reuse checks the
  holder's full key. An entry whose fragment left the index is stale and ignored (fragment ids
  are never reused).

The space's lock guards both; neither is thread-safe alone.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Collection, Sequence

import numpy as np

from .load import short_keys
from .matrix import VectorIndex

#: Spare vectors (not used by a live fragment) kept in memory, as a share of max_vector_mib.
SPARE_SHARE = 0.25


def _key_hashes(keys: Sequence[str]) -> np.ndarray:
    """Sorted unique 8-byte hashes of entry keys (for :attr:`Spares.evicted`)."""
    return np.unique(
        np.fromiter(
            (
                int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little")
                for k in keys
            ),
            dtype=np.uint64,
            count=len(keys),
        )
    )


class Spares:
    """Spare vectors by content key, bounded, and the hashes of those trimmed (see the module docstring)."""

    def __init__(self, dims: int, max_vector_mib: float) -> None:
        self.budget = int(max_vector_mib * 1024 * 1024 * SPARE_SHARE) // max(1, dims * 4)
        self.vecs: dict[str, np.ndarray] | None = None  # None until the sidecar is read
        self.evicted = np.empty(0, dtype=np.uint64)
        # Sealed vectors were dropped without their keys (drop() without keys): any miss re-reads.
        self.partial = False

    def start(self, vecs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """A load of the whole sidecar begins (or ended with ``vecs``): nothing trimmed, nothing unknown."""
        self.vecs = {} if vecs is None else vecs
        self.evicted = np.empty(0, dtype=np.uint64)
        self.partial = False
        return self.vecs

    def get(self, key: str) -> np.ndarray | None:
        return None if self.vecs is None else self.vecs.get(key)

    def put(self, key: str, vec: np.ndarray) -> None:
        """``vec`` becomes the newest spare of ``key`` (once the sidecar was read)."""
        if self.vecs is not None:
            self.vecs.pop(key, None)
            self.vecs[key] = vec

    def take(self, key: str) -> None:
        """``key``'s vector is live now: not a spare."""
        if self.vecs is not None:
            self.vecs.pop(key, None)

    def keep_only(self, keep: Collection[str]) -> None:
        """Compaction: spares of a key not in ``keep`` go."""
        if self.vecs is not None:
            self.vecs = {k: v for k, v in self.vecs.items() if k in keep}

    def trim(self) -> None:
        """Keep at most ``budget`` spare vectors (the newest)."""
        if self.vecs is None:
            return
        if len(self.vecs) > self.budget:
            drop = len(self.vecs) - self.budget
            gone = list(itertools.islice(self.vecs, drop))
            for k in gone:
                del self.vecs[k]
            self.evicted = np.union1d(self.evicted, _key_hashes(gone))

    def may_be_sealed(self, keys: Sequence[str]) -> bool:
        """Whether the sidecar may hold a vector for one of ``keys`` that memory does not."""
        if not keys:
            return False
        if self.partial:
            return True
        return bool(self.evicted.size) and bool(
            np.isin(_key_hashes(keys), self.evicted, assume_unique=False).any()
        )

    @property
    def count(self) -> int:
        return 0 if self.vecs is None else len(self.vecs)

    def clear(self) -> None:
        """The vault locked: no vector is kept (the sidecar is read again at the next unlock)."""
        self.vecs = None
        self.evicted = np.empty(0, dtype=np.uint64)


class Holders:
    """Content key (its first 64 bits, ~8 MiB per 100,000 fragments) -> a fragment in ``index`` with that vector."""

    def __init__(self, index: VectorIndex) -> None:
        self.index = index
        self._map: dict[int, int] = {}

    @staticmethod
    def _short(key: str) -> int:
        return int(key[:16], 16)

    def holder(self, key: str) -> int | None:
        """The fragment in the index that may have ``key`` (its full key not checked)."""
        fid = self._map.get(self._short(key))
        return fid if fid is not None and fid in self.index else None

    def is_held(self, key: str) -> bool:
        """Whether a fragment in the index may have ``key`` (not checked: for bookkeeping only)."""
        return self.holder(key) is not None

    def hold_arrays(self, fids: np.ndarray, keys: np.ndarray) -> None:
        """:meth:`hold` of a load's (fid, S32 key) arrays: in bulk when nothing is held yet."""
        if self._map:
            self.hold(list(zip(fids.tolist(), keys.astype("U").tolist(), strict=True)))
        else:
            self._map = dict(zip(short_keys(keys).tolist(), fids.tolist(), strict=True))

    def hold(self, pairs: Sequence[tuple[int, str]]) -> None:
        if not self._map:  # the first load: every pair (a key held twice keeps either fragment)
            self._map = {int(key[:16], 16): fid for fid, key in pairs}
            return
        for fid, key in pairs:
            old = self._map.get(self._short(key))
            if old is None or old not in self.index:
                self._map[self._short(key)] = fid
        if len(self._map) > 2 * len(self.index) + 1024:  # stale entries (fragments left the index)
            self._map = {k: f for k, f in self._map.items() if f in self.index}

    def release(self, fid: int, key: str) -> None:
        """``fid`` left the index."""
        if self._map.get(self._short(key)) == fid:
            del self._map[self._short(key)]

    def clear(self) -> None:
        self._map = {}


__all__ = ["Spares", "Holders", "SPARE_SHARE"]
