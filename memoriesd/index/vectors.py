"""In-memory vector index: one contiguous normalized float32 matrix, exact cosine top-k.

At the cache caps (10,000 fragments x 768 dims = 30 MiB) a matrix product plus
``argpartition`` answers in about a millisecond, so no approximate index is needed.
Rows live in a buffer with spare capacity; ``add`` upserts, ``remove`` moves the last
row into the hole, so the used rows ``[:n]`` always stay one contiguous block.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from ..errors import CapExceeded

MIB = 1024 * 1024
_FLOAT_BYTES = 4


def vector_bytes(count: int, dims: int) -> int:
    """Bytes ``count`` float32 vectors of ``dims`` take."""
    return count * dims * _FLOAT_BYTES


def check_vector_cap(count: int, dims: int, max_vector_mib: float) -> None:
    """Raise :class:`CapExceeded` when ``count`` vectors of ``dims`` exceed ``[rag.cache] max_vector_mib``."""
    size = vector_bytes(count, dims)
    if size > max_vector_mib * MIB:
        raise CapExceeded(
            f"the vector cache would hold {size / MIB:.1f} MiB ({count} vectors of {dims} dimensions), "
            f"over the cache cap of {max_vector_mib:g} MiB of vectors: raise [rag.cache] max_vector_mib in config.toml"
        )


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 copy with unit-length rows (zero rows stay zero)."""
    arr = np.array(vectors, dtype=np.float32, copy=True, ndmin=2)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    np.divide(arr, norms, out=arr, where=norms > 0)
    return arr


class VectorIndex:
    """Exact cosine search over int keys (fragment ids).

    ``max_vector_mib`` (optional) is checked on every ``add``: an add that would
    exceed it raises :class:`CapExceeded` and leaves the index unchanged.
    """

    def __init__(self, dims: int, *, max_vector_mib: float | None = None) -> None:
        if dims <= 0:
            raise ValueError("dims must be positive")
        self.dims = dims
        self.max_vector_mib = max_vector_mib
        self._buf = np.empty((0, dims), dtype=np.float32)
        self._keys: list[int] = []
        self._row: dict[int, int] = {}

    @classmethod
    def build(
        cls, keys: Sequence[int], vectors: np.ndarray, *, max_vector_mib: float | None = None
    ) -> VectorIndex:
        """An index over ``keys`` aligned with the rows of ``vectors``."""
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.ndim != 2:
            raise ValueError("vectors must be a 2-D (n, dims) array")
        index = cls(arr.shape[1], max_vector_mib=max_vector_mib)
        index.add(keys, arr)
        return index

    # -- size --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._row

    @property
    def nbytes(self) -> int:
        """Bytes of the stored vectors (the used rows; spare capacity is at most half of that)."""
        return vector_bytes(len(self._keys), self.dims)

    @property
    def matrix(self) -> np.ndarray:
        """The (n, d) matrix of used rows (a view: do not modify)."""
        return self._buf[: len(self._keys)]

    def keys(self) -> list[int]:
        """Keys in row order."""
        return list(self._keys)

    def get(self, key: int) -> np.ndarray | None:
        row = self._row.get(key)
        return None if row is None else self._buf[row].copy()

    # -- updates -----------------------------------------------------------------------------

    def add(self, keys: Sequence[int], vectors: np.ndarray) -> None:
        """Insert or replace ``keys`` with ``vectors`` (normalized here)."""
        arr = normalize_rows(vectors) if len(keys) else np.empty((0, self.dims), np.float32)
        if arr.shape != (len(keys), self.dims):
            raise ValueError(f"expected {len(keys)} vectors of {self.dims} dimensions, got shape {arr.shape}")
        latest: dict[int, int] = {}
        for i, k in enumerate(keys):
            latest[int(k)] = i  # a key given twice: the last vector wins
        new = [k for k in latest if k not in self._row]
        total = len(self._keys) + len(new)
        if self.max_vector_mib is not None:
            check_vector_cap(total, self.dims, self.max_vector_mib)
        self._reserve(total)
        for k, i in latest.items():
            row = self._row.get(k)
            if row is None:
                row = len(self._keys)
                self._keys.append(k)
                self._row[k] = row
            self._buf[row] = arr[i]

    def remove(self, keys: Iterable[int]) -> int:
        """Drop ``keys`` (absent ones are ignored); returns how many were removed."""
        removed = 0
        for k in keys:
            row = self._row.pop(int(k), None)
            if row is None:
                continue
            last = len(self._keys) - 1
            if row != last:
                moved = self._keys[last]
                self._buf[row] = self._buf[last]
                self._keys[row] = moved
                self._row[moved] = row
            self._keys.pop()
            removed += 1
        n = len(self._keys)
        if removed and self._buf.shape[0] > max(64, 4 * n):  # most rows gone: give the spare capacity back
            self._buf = self._buf[: max(64, 2 * n)].copy()
        return removed

    @property
    def capacity(self) -> int:
        """Rows allocated (at least ``len(self)``)."""
        return int(self._buf.shape[0])

    def clear(self) -> None:
        self._buf = np.empty((0, self.dims), dtype=np.float32)
        self._keys.clear()
        self._row.clear()

    def _reserve(self, rows: int) -> None:
        if rows <= self._buf.shape[0]:
            return
        capacity = max(rows, int(self._buf.shape[0] * 1.5), 64)
        if self.max_vector_mib is not None:
            cap_rows = int(self.max_vector_mib * MIB) // (self.dims * _FLOAT_BYTES)
            capacity = max(rows, min(capacity, cap_rows))
        buf = np.empty((capacity, self.dims), dtype=np.float32)
        n = len(self._keys)
        buf[:n] = self._buf[:n]
        self._buf = buf

    # -- search ------------------------------------------------------------------------------

    def _query(self, query: np.ndarray) -> np.ndarray | None:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dims:
            raise ValueError(f"query has {q.shape[0]} dimensions, the index {self.dims}")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm) or norm == 0.0:
            return None
        return q / norm

    def search(
        self,
        query: np.ndarray,
        k: int,
        *,
        allowed: Collection[int] | None = None,
        min_score: float | None = None,
    ) -> list[tuple[int, float]]:
        """Top ``k`` ``(key, cosine)`` pairs, best first (ties by key).

        ``allowed`` restricts the candidates (keys not in the index are ignored);
        ``min_score`` drops results scoring below it.
        """
        n = len(self._keys)
        q = self._query(query)
        if k <= 0 or n == 0 or q is None:
            return []
        if allowed is None:
            rows = None
            scores = self._buf[:n] @ q
        else:
            rows = np.fromiter((self._row[a] for a in allowed if a in self._row), dtype=np.int64)
            if rows.size == 0:
                return []
            if rows.size * 4 < n:
                scores = self._buf[rows] @ q  # small subset: score only those rows
            else:
                full = self._buf[:n] @ q
                scores = full[rows]
        if min_score is not None:
            keep = np.flatnonzero(scores >= min_score)
            if keep.size == 0:
                return []
            scores = scores[keep]
            rows = keep if rows is None else rows[keep]
        top = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
        picked = rows[top] if rows is not None else top
        pairs = [(self._keys[int(r)], float(s)) for r, s in zip(picked, scores[top], strict=True)]
        pairs.sort(key=lambda p: (-p[1], p[0]))
        return pairs

    def score(self, query: np.ndarray, keys: Sequence[int]) -> list[float | None]:
        """Cosine of ``query`` with each of ``keys`` (None for keys without a vector)."""
        q = self._query(query)
        rows = [self._row.get(int(k)) for k in keys]
        present = [r for r in rows if r is not None]
        if q is None or not present:
            return [None if r is None else 0.0 for r in rows]
        values = iter((self._buf[np.asarray(present, dtype=np.int64)] @ q).tolist())
        return [None if r is None else float(next(values)) for r in rows]
