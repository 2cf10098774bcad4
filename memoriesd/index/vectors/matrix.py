"""In-memory vector index: one contiguous matrix of normalized rows, exact top-k over it.

Rows are held in one of three representations (``[index] vector_precision``):

- ``float32``: 4 bytes a dimension; scores are the exact float32 cosines.
- ``float16``: 2 bytes a dimension (IEEE half). Scoring widens a block of rows to float32 with
  two integer operations (8x faster than numpy's own float16 cast here) and scores it in float32.
- ``int8``: 1 byte a dimension plus one float32 scale a row (symmetric, per row: the largest
  component maps to +-127; the scale also divides by the quantized row's norm, so a score is the
  exact cosine of the stored direction). A block of rows is widened to float32 and scored.

Every stored row is scored (no approximate index). The measured cost of the narrow ones (docs/benchmarks.md
"Memory and the cache caps"): int8 changes SciFact nDCG@10 by at most 0.001 (MiniLM and
EmbeddingGemma) and a cosine by at most 0.0016, for a quarter of float32's memory; float16 changes
neither measurably. Re-scoring int8 candidates with float32 rows was measured and left out (it
would open most of a vault's sealed chunks for every query), so the sidecar seals rows in this
representation too (:mod:`~memoriesd.index.vectors.chunks`) and :meth:`VectorIndex.add_encoded` takes
them as stored.

Narrow rows are scored in blocks of ``_BLOCK_ELEMS`` values: small enough to stay in the CPU
cache and under OpenBLAS's threading threshold for a matrix-vector product (measured on 2 busy
cores: 512-row blocks of 768 dims took 13 ms for 100,000 rows, 1,024-row blocks, which OpenBLAS
threads, 390 ms). Rows live in a buffer with spare
capacity; ``add`` upserts, ``remove`` moves the last row into the hole, so the used rows ``[:n]``
always stay one contiguous block.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from ...errors import CapExceeded

MIB = 1024 * 1024
PRECISIONS = ("float32", "float16", "int8")
_BLOCK_ELEMS = 384 * 1024  # values widened to float32 at a time (1.5 MiB)
_ADD_BLOCK_ROWS = 4096  # rows normalized and encoded at a time by add (bounds its temporaries)
_F16_BITS_MASK = np.int32(0x8FFFE000 - (1 << 32))  # sign bit + 15 exponent/mantissa bits, after << 13
_F16_UNBIAS = np.float32(2.0**112)  # 2^(127 - 15): the exponent bias difference


def bytes_per_vector(dims: int, precision: str = "float32") -> int:
    """Bytes one stored vector of ``dims`` takes in ``precision`` (int8 counts its row scale)."""
    if precision == "float32":
        return dims * 4
    if precision == "float16":
        return dims * 2
    if precision == "int8":
        return dims + 4
    raise ValueError(f"unknown vector precision {precision!r}: allowed is one of {', '.join(PRECISIONS)}")


def vector_bytes(count: int, dims: int, precision: str = "float32") -> int:
    """Bytes ``count`` vectors of ``dims`` take in ``precision``."""
    return count * bytes_per_vector(dims, precision)


def check_vector_cap(count: int, dims: int, max_vector_mib: float, precision: str = "float32") -> None:
    """Raise :class:`CapExceeded` when ``count`` vectors of ``dims`` held as ``precision`` exceed
    ``[index] max_vector_mib``."""
    size = vector_bytes(count, dims, precision)
    if size > max_vector_mib * MIB:
        raise CapExceeded(
            f"the vector cache would hold {size / MIB:.1f} MiB ({count} vectors of {dims} dimensions as {precision}), "
            f"over the cache cap of {max_vector_mib:g} MiB of vectors: raise [index] max_vector_mib in config.toml"
        )


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 copy with unit-length rows (zero rows stay zero)."""
    arr = np.array(vectors, dtype=np.float32, copy=True, ndmin=2)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    np.divide(arr, norms, out=arr, where=norms > 0)
    return arr


def quantize_int8(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes and float32 per-row scales of rows (of any length: the codes depend only on a
    row's direction): the largest component maps to +-127, and ``codes * scale`` has the direction
    of the quantized row and unit length (zero rows: zero codes, scale 0). One float32 temporary:
    the rounded values, whose squares give the codes' norms (a 100,000 x 768 load spends most of
    its time here)."""
    rows = np.asarray(rows, dtype=np.float32)
    n = rows.shape[0]
    if not rows.size:
        return np.zeros(rows.shape, dtype=np.int8), np.zeros(n, dtype=np.float32)
    peak = np.maximum(rows.max(axis=1), -rows.min(axis=1))
    inv = np.divide(np.float32(127.0), peak, out=np.zeros(n, dtype=np.float32), where=peak > 0)
    rounded = rows * inv[:, None]
    np.rint(rounded, out=rounded)
    codes = rounded.astype(np.int8)
    sq = np.einsum("ij,ij->i", rounded, rounded)
    scale = np.divide(np.float32(1.0), np.sqrt(sq), out=np.zeros(n, dtype=np.float32), where=sq > 0)
    return codes, scale


class VectorIndex:
    """Exact cosine search over int keys (fragment ids), rows held as ``precision``.

    ``max_vector_mib`` (optional) is checked on every ``add`` against the representation's real
    bytes: an add that would exceed it raises :class:`CapExceeded` and leaves the index unchanged.
    """

    def __init__(self, dims: int, *, max_vector_mib: float | None = None, precision: str = "float32") -> None:
        if dims <= 0:
            raise ValueError("dims must be positive")
        bytes_per_vector(dims, precision)  # validates the name
        self.dims = dims
        self.precision = precision
        self.max_vector_mib = max_vector_mib
        self._dtype = {"float32": np.float32, "float16": np.int16, "int8": np.int8}[precision]
        self._buf = np.empty((0, dims), dtype=self._dtype)
        self._scale = np.empty(0, dtype=np.float32)  # int8 only: one per row of _buf
        self._keys: list[int] = []
        self._row: dict[int, int] = {}
        self._negative = 0  # keys below 0 (turn windows of conversation fragments, by convention)

    @classmethod
    def build(
        cls, keys: Sequence[int], vectors: np.ndarray, *, max_vector_mib: float | None = None,
        precision: str = "float32",
    ) -> VectorIndex:
        """An index over ``keys`` aligned with the rows of ``vectors``."""
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.ndim != 2:
            raise ValueError("vectors must be a 2-D (n, dims) array")
        index = cls(arr.shape[1], max_vector_mib=max_vector_mib, precision=precision)
        index.add(keys, arr)
        return index

    # -- size --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._row

    @property
    def negative_keys(self) -> int:
        """How many keys are below 0."""
        return self._negative

    @property
    def nbytes(self) -> int:
        """Bytes of the stored vectors in their representation (the used rows; spare capacity
        is at most half of that)."""
        return vector_bytes(len(self._keys), self.dims, self.precision)

    @property
    def matrix(self) -> np.ndarray:
        """The (n, d) float32 matrix of used rows: a view for float32 (do not modify), a decoded
        copy otherwise."""
        n = len(self._keys)
        if self.precision == "float32":
            return self._buf[:n]
        return self._decode(self._buf[:n], self._scale[:n] if self.precision == "int8" else None)

    def rows(self, start: int, stop: int, step: int = 1) -> np.ndarray:
        """Decoded float32 copies of the used rows at positions ``start:stop:step`` (the relevance
        floor's calibration reads the index in blocks: :mod:`memoriesd.rag.floor`)."""
        sl = slice(start, min(stop, len(self._keys)), step)
        return self._decode(self._buf[sl], self._scale[sl] if self.precision == "int8" else None)

    def absent(self, keys: Iterable[int]) -> list[int]:
        """Those of ``keys`` that have no row, in order (one dict lookup each)."""
        row = self._row
        return [k for k in keys if k not in row]

    def keys(self) -> list[int]:
        """Keys in row order."""
        return list(self._keys)

    def get(self, key: int) -> np.ndarray | None:
        """The stored (normalized, and for narrow precisions decoded) float32 vector of ``key``."""
        row = self._row.get(key)
        if row is None:
            return None
        scale = self._scale[row : row + 1] if self.precision == "int8" else None
        vec: np.ndarray = self._decode(self._buf[row : row + 1], scale)[0]
        return vec

    # -- representation ----------------------------------------------------------------------

    def _encode(self, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self.precision == "float32":
            return unit, None
        if self.precision == "float16":
            return unit.astype(np.float16).view(np.int16), None
        return quantize_int8(unit)

    def _encode_raw(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`_encode` of rows not normalized yet. int8 codes do not depend on a row's length
        (the largest component maps to +-127, the scale divides by the codes' norm), so int8 skips
        the float32 normalized copy; the others normalize first."""
        if self.precision == "int8":
            return quantize_int8(rows)
        return self._encode(normalize_rows(rows))

    @staticmethod
    def _f16_bits_to_f32(half: np.ndarray, out: np.ndarray) -> np.ndarray:
        """float16 bit patterns (int16) to float32 values scaled by 2^-112 (exact, subnormals
        included): sign-extend, shift the exponent and mantissa into place, mask the sign copies."""
        wide = out.view(np.int32)
        np.copyto(wide, half, casting="unsafe")
        np.left_shift(wide, 13, out=wide)
        np.bitwise_and(wide, _F16_BITS_MASK, out=wide)
        return out

    def _decode(self, codes: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
        out = np.empty(codes.shape, dtype=np.float32)
        if self.precision == "float32":
            out[...] = codes
        elif self.precision == "float16":
            self._f16_bits_to_f32(codes, out)
            out *= _F16_UNBIAS
        else:
            np.copyto(out, codes, casting="unsafe")
            out *= np.asarray(scale, dtype=np.float32)[:, None]
        return out

    def _scores(self, codes: np.ndarray, scale: np.ndarray | None, q: np.ndarray) -> np.ndarray:
        """Cosine of the unit query ``q`` with each row of ``codes`` (float32)."""
        if self.precision == "float32":
            scores: np.ndarray = codes @ q
            return scores
        n = codes.shape[0]
        out = np.empty(n, dtype=np.float32)
        if n == 0:
            return out
        block = max(16, min(n, _BLOCK_ELEMS // self.dims))
        scratch = np.empty((block, self.dims), dtype=np.float32)
        qq = q * _F16_UNBIAS if self.precision == "float16" else q
        for start in range(0, n, block):
            part = codes[start : start + block]
            m = part.shape[0]
            if self.precision == "float16":
                self._f16_bits_to_f32(part, scratch[:m])
            else:
                np.copyto(scratch[:m], part, casting="unsafe")
            np.dot(scratch[:m], qq, out=out[start : start + m])
        if scale is not None:
            out *= scale
        return out

    # -- updates -----------------------------------------------------------------------------

    def add(self, keys: Sequence[int], vectors: np.ndarray | Sequence[np.ndarray]) -> None:
        """Insert or replace ``keys`` with ``vectors`` (a 2-D array or a sequence of rows).

        Shapes and the cap are checked first (a refused add changes nothing); then rows are
        normalized and encoded into the buffer a block at a time, so no full float32 copy is made.
        """
        if isinstance(vectors, np.ndarray) and vectors.ndim == 1 and len(keys) == 1:
            vectors = vectors.reshape(1, -1)
        if len(vectors) != len(keys):
            raise ValueError(f"expected {len(keys)} vectors of {self.dims} dimensions, got {len(vectors)}")
        if isinstance(vectors, np.ndarray):
            if len(keys) and (vectors.ndim != 2 or vectors.shape[1] != self.dims):
                raise ValueError(f"expected vectors of {self.dims} dimensions, got shape {vectors.shape}")
        else:
            for v in vectors:
                if np.shape(v) != (self.dims,):
                    raise ValueError(f"expected vectors of {self.dims} dimensions, got shape {np.shape(v)}")
        int_keys = [int(k) for k in keys]
        if isinstance(vectors, np.ndarray) and self._add_new(int_keys, vectors):
            return
        latest: dict[int, int] = {}
        for i, k in enumerate(int_keys):
            latest[k] = i  # a key given twice: the last vector wins
        items = list(latest.items())
        total = len(self._keys) + sum(1 for k, _ in items if k not in self._row)
        if self.max_vector_mib is not None:
            check_vector_cap(total, self.dims, self.max_vector_mib, self.precision)
        self._reserve(total)
        for start in range(0, len(items), _ADD_BLOCK_ROWS):
            part = items[start : start + _ADD_BLOCK_ROWS]
            idx = [i for _, i in part]
            if isinstance(vectors, np.ndarray):
                arr = vectors[np.asarray(idx, dtype=np.int64)]
            else:
                arr = np.asarray([vectors[i] for i in idx], dtype=np.float32)
            codes, scale = self._encode_raw(arr)
            rows = []
            for k, _ in part:
                row = self._row.get(k)
                if row is None:
                    row = len(self._keys)
                    self._keys.append(k)
                    self._row[k] = row
                    self._negative += k < 0
                rows.append(row)
            at = np.asarray(rows, dtype=np.int64)
            self._buf[at] = codes
            if scale is not None:
                self._scale[at] = scale

    def _add_new(self, keys: list[int], vectors: np.ndarray) -> bool:
        """:meth:`add` of keys that are all new and distinct (loading an index): rows appended in
        order, encoded a block at a time, with no per-key bookkeeping beyond the key maps. False
        (nothing done) when a key is already present or given twice."""
        row_of = self._row
        if len(set(keys)) != len(keys) or any(k in row_of for k in keys):
            return False
        n0 = len(self._keys)
        total = n0 + len(keys)
        if self.max_vector_mib is not None:
            check_vector_cap(total, self.dims, self.max_vector_mib, self.precision)
        self._reserve(total)
        for start in range(0, len(keys), _ADD_BLOCK_ROWS):
            codes, scale = self._encode_raw(vectors[start : start + _ADD_BLOCK_ROWS])
            self._buf[n0 + start : n0 + start + codes.shape[0]] = codes
            if scale is not None:
                self._scale[n0 + start : n0 + start + codes.shape[0]] = scale
        self._keys.extend(keys)
        row_of.update(zip(keys, range(n0, total), strict=True))
        self._negative += sum(1 for k in keys if k < 0)
        return True

    def add_encoded(
        self, keys: Sequence[int], encoding: str, rows: np.ndarray, scales: np.ndarray | None, *, adopt: bool = False
    ) -> None:
        """Add new, distinct ``keys`` with rows as a sidecar chunk holds them
        (:mod:`~memoriesd.index.vectors.chunks`: float32 as embedded, int8 codes with ``scales``, or
        float16 bit patterns of unit rows). Rows in this index's own precision are copied as they
        are (no decode, no re-quantising); others are decoded and encoded. ``adopt``: an empty
        index takes ``rows``/``scales`` as its buffer (no copy; the caller gives them up)."""
        if len(keys) != rows.shape[0]:
            raise ValueError(f"expected {len(keys)} rows, got {rows.shape[0]}")
        if encoding != self.precision or encoding == "float32":
            if encoding == "int8":
                assert scales is not None
                wide = rows.astype(np.float32)
                wide *= np.asarray(scales, dtype=np.float32)[:, None]
            elif encoding == "float16":
                wide = rows.view("<f2").astype(np.float32)
            else:
                wide = np.asarray(rows, dtype=np.float32)
            self.add(keys, wide)
            return
        int_keys = [int(k) for k in keys]
        if len(set(int_keys)) != len(int_keys) or any(k in self._row for k in int_keys):
            raise ValueError("add_encoded takes new, distinct keys only")
        n0 = len(self._keys)
        total = n0 + len(int_keys)
        if self.max_vector_mib is not None:
            check_vector_cap(total, self.dims, self.max_vector_mib, self.precision)
        if adopt and n0 == 0 and rows.dtype == self._dtype and rows.flags.c_contiguous and rows.flags.writeable:
            self._buf = rows
            if self.precision == "int8":
                assert scales is not None
                self._scale = np.ascontiguousarray(scales, dtype=np.float32)
        else:
            self._reserve(total)
            self._buf[n0:total] = rows
            if self.precision == "int8":
                assert scales is not None
                self._scale[n0:total] = scales
        self._keys.extend(int_keys)
        self._row.update(zip(int_keys, range(n0, total), strict=True))
        self._negative += sum(1 for k in int_keys if k < 0)

    def remove(self, keys: Iterable[int]) -> int:
        """Drop ``keys`` (absent ones are ignored); returns how many were removed."""
        removed = 0
        for k in keys:
            row = self._row.pop(int(k), None)
            if row is None:
                continue
            self._negative -= int(k) < 0
            last = len(self._keys) - 1
            if row != last:
                moved = self._keys[last]
                self._buf[row] = self._buf[last]
                if self._scale.size:
                    self._scale[row] = self._scale[last]
                self._keys[row] = moved
                self._row[moved] = row
            self._keys.pop()
            removed += 1
        n = len(self._keys)
        if removed and self._buf.shape[0] > max(64, 4 * n):  # most rows gone: give the spare capacity back
            keep = max(64, 2 * n)
            self._buf = self._buf[:keep].copy()
            if self._scale.size:
                self._scale = self._scale[:keep].copy()
        return removed

    @property
    def capacity(self) -> int:
        """Rows allocated (at least ``len(self)``)."""
        return int(self._buf.shape[0])

    def clear(self) -> None:
        self._buf = np.empty((0, self.dims), dtype=self._dtype)
        self._scale = np.empty(0, dtype=np.float32)
        self._keys.clear()
        self._row.clear()
        self._negative = 0

    def _reserve(self, rows: int) -> None:
        if rows <= self._buf.shape[0]:
            return
        capacity = max(rows, int(self._buf.shape[0] * 1.5), 64)
        if self.max_vector_mib is not None:
            cap_rows = int(self.max_vector_mib * MIB) // bytes_per_vector(self.dims, self.precision)
            capacity = max(rows, min(capacity, cap_rows))
        n = len(self._keys)
        buf = np.empty((capacity, self.dims), dtype=self._dtype)
        buf[:n] = self._buf[:n]
        self._buf = buf
        if self.precision == "int8":
            scale = np.zeros(capacity, dtype=np.float32)
            scale[:n] = self._scale[:n]
            self._scale = scale

    # -- search ------------------------------------------------------------------------------

    def _query(self, query: np.ndarray) -> np.ndarray | None:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dims:
            raise ValueError(f"query has {q.shape[0]} dimensions, the index {self.dims}")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm) or norm == 0.0:
            return None
        return q / norm

    def _rows_scores(self, rows: np.ndarray | None, q: np.ndarray) -> np.ndarray:
        """Scores of ``rows`` (None = every used row)."""
        n = len(self._keys)
        if rows is None:
            return self._scores(self._buf[:n], self._scale[:n] if self._scale.size else None, q)
        return self._scores(self._buf[rows], self._scale[rows] if self._scale.size else None, q)

    def search(
        self,
        query: np.ndarray,
        k: int,
        *,
        allowed: Collection[int] | None = None,
        min_score: float | None = None,
        skip_negative: bool = False,
    ) -> list[tuple[int, float]]:
        """Top ``k`` ``(key, cosine)`` pairs, best first (ties by key).

        ``allowed`` restricts the candidates (keys not in the index are ignored);
        ``min_score`` drops results scoring below it; ``skip_negative`` leaves out keys below 0.
        """
        n = len(self._keys)
        q = self._query(query)
        if k <= 0 or n == 0 or q is None:
            return []
        skip = skip_negative and self._negative > 0
        if allowed is None and not skip:
            rows = None
            scores = self._rows_scores(None, q)
        else:
            if allowed is None:  # every row whose key is not negative (rows are positions in _keys)
                rows = np.flatnonzero(np.fromiter(self._keys, dtype=np.int64, count=n) >= 0)
            else:
                rows = np.fromiter((self._row[a] for a in allowed if a in self._row and (a >= 0 or not skip)), dtype=np.int64)
            if rows.size == 0:
                return []
            if rows.size * 4 < n:
                scores = self._rows_scores(rows, q)  # small subset: score only those rows
            else:
                full = self._rows_scores(None, q)
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
        values = iter(self._rows_scores(np.asarray(present, dtype=np.int64), q).tolist())
        return [None if r is None else float(next(values)) for r in rows]
