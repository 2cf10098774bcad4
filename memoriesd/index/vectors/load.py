"""Matching a sealed sidecar's entries to the fragments that want them, a chunk at a time, in bulk.

The first vector search after unlock loads every live fragment's vector: about 100,000 content keys
against about 100,000 sidecar entries. :class:`SidecarMatch` does that with array operations instead
of a Python step per entry: the wanted keys are sorted once; each chunk's keys (an ``S32`` view of
its plaintext, :mod:`~memoriesd.index.vectors.chunks`) are looked up with one ``searchsorted``; the
rows found are copied as stored (int8 codes and scales for the default precision) into one staging
buffer that the empty index then adopts. Entries no live fragment wants are handed to ``spare``
(keys as strings, rows decoded to float32): usually few. A key found twice in the file keeps its
later row, as a whole-file read does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .chunks import CONTENT_KEY_HEX, Chunk
from .matrix import normalize_rows, quantize_int8
from .names import is_legacy_key

_KEY = f"S{CONTENT_KEY_HEX}"
_BATCH_ROWS = 2048  # entries of small chunks matched at once


@dataclass
class Matched:
    """What a scan found: index rows (staging, adopted by an empty index) and their fragments."""

    fids: list[int]  # one per row, in row order (fragments with the same input each have a row)
    rows: np.ndarray  # (len(fids), dims) in the index's precision (int8 codes, float16 bits or float32)
    scales: np.ndarray | None  # int8: one per row
    pair_fids: np.ndarray  # every fragment given a vector (int64) ...
    pair_keys: np.ndarray  # ... and its content key (S32)
    seen: int  # entries read
    legacy: bool  # the file holds old-scheme keys (the caller re-keys it through the whole-file path)


class SidecarMatch:
    """Collects, from a sidecar scan, the rows of ``wanted``: fragment ids (int64) and their content
    keys (``S32``), aligned."""

    def __init__(
        self, wanted: tuple[np.ndarray, np.ndarray], dims: int, precision: str,
        spare: Callable[[list[str], np.ndarray], None],
    ) -> None:
        fids, keys = wanted
        n = len(fids)
        self.dims = dims
        self.precision = precision
        self._spare = spare
        halves = _halves(keys)  # sorting integers is much faster than sorting strings
        order = np.lexsort((halves[1], halves[0])) if halves is not None else np.argsort(keys, kind="stable")
        self._sorted_keys = keys[order]
        self._sorted_fids = fids[order]
        first = np.ones(n, dtype=bool)
        if n > 1:
            first[1:] = self._sorted_keys[1:] != self._sorted_keys[:-1]
        self._first = first
        self._group = np.cumsum(first) - 1  # group (distinct key) of each sorted entry
        self._ukeys = self._sorted_keys[first]
        self._slot = np.full(len(self._ukeys), -1, dtype=np.int64)  # staging row of each distinct key
        # The keys as two 64-bit halves: searchsorted over integers, not strings (5-10x faster).
        # Lower-case hex sorts as its value; a shared upper half (never seen) keeps the string path.
        self._halves = _halves(self._ukeys)
        if self._halves is not None and len(self._ukeys) > 1 and not (np.diff(self._halves[0]) > 0).all():
            self._halves = None
        self._n = 0
        dtype = {"float32": np.float32, "float16": np.int16, "int8": np.int8}[precision]
        # Room for every wanted fragment: those sharing an input get copies of its row at the end.
        self._rows = np.empty((n, dims), dtype=dtype)
        self._scales = np.zeros(n, dtype=np.float32) if precision == "int8" else None
        self._by_text: dict[str, int] | None = None  # distinct key -> group, for chunks of other keys
        self.seen = 0
        self.legacy = False
        self._pending: list[Chunk] = []  # small chunks gathered (content keys, one encoding)
        self._pending_rows = 0

    # ------------------------------------------------------------------ per chunk

    def take(self, chunk: Chunk) -> None:
        """One chunk of the scan. Small chunks (an embedding batch appends one) are gathered up to
        :data:`_BATCH_ROWS` entries and matched together: the cost per call, not per entry, is
        what a file of many small chunks pays."""
        count = len(chunk)
        self.seen += count
        if not count:
            return
        if chunk.key_array is not None and (not self._pending or self._pending[0].encoding == chunk.encoding):
            self._pending.append(chunk)
            self._pending_rows += count
            if self._pending_rows >= _BATCH_ROWS:
                self._flush()
            return
        self._flush()
        self._match(chunk)

    def _flush(self) -> None:
        pending, self._pending, self._pending_rows = self._pending, [], 0
        if len(pending) == 1:
            self._match(pending[0])
        elif pending:
            scales = [c.scales for c in pending if c.scales is not None]
            self._match(Chunk(
                pending[0].encoding, np.concatenate([c.rows for c in pending]),
                np.concatenate(scales) if scales else None, np.concatenate([c.key_array for c in pending if c.key_array is not None]),
            ))

    def _match(self, chunk: Chunk) -> None:
        count = len(chunk)
        if chunk.key_array is not None and len(self._ukeys):
            ck = chunk.key_array
            got = _halves(ck) if self._halves is not None else None
            if got is not None and self._halves is not None:
                hi, lo = self._halves
                pos = np.searchsorted(hi, got[0])
                np.minimum(pos, len(hi) - 1, out=pos)
                hit = (hi[pos] == got[0]) & (lo[pos] == got[1])
            else:
                pos = np.searchsorted(self._ukeys, ck)
                np.minimum(pos, len(self._ukeys) - 1, out=pos)
                hit = self._ukeys[pos] == ck
            at = np.flatnonzero(hit)
            groups = pos[at]
            miss = np.flatnonzero(~hit)
        else:
            keys = chunk.keys
            if any(is_legacy_key(k) for k in keys):
                self.legacy = True
            by_text = self._groups_by_text()
            found = [(i, by_text[k]) for i, k in enumerate(keys) if k in by_text]
            at = np.fromiter((i for i, _ in found), dtype=np.int64, count=len(found))
            groups = np.fromiter((g for _, g in found), dtype=np.int64, count=len(found))
            miss = np.setdiff1d(np.arange(count), at, assume_unique=True)
        if at.size:
            self._stage(chunk, at, groups)
        if miss.size:
            self._spare([chunk.keys[i] for i in miss.tolist()], chunk.decoded(miss))

    def _groups_by_text(self) -> dict[str, int]:
        if self._by_text is None:
            self._by_text = {k: g for g, k in enumerate(self._ukeys.astype("U").tolist())}
        return self._by_text

    def _stage(self, chunk: Chunk, at: np.ndarray, groups: np.ndarray) -> None:
        if groups.size > 1 and np.unique(groups).size != groups.size:  # a key twice here: its later row wins
            rev_groups, rev_first = np.unique(groups[::-1], return_index=True)
            at, groups = at[groups.size - 1 - rev_first], rev_groups
        slots = self._slot[groups]
        new = slots < 0
        k = int(new.sum())
        contiguous = k == slots.size  # all new (the usual case): one block of staging rows
        if k:
            slots[new] = np.arange(self._n, self._n + k)
            self._slot[groups[new]] = slots[new]
            self._n += k
        rows, scales = self._encoded(chunk, at)
        target: slice | np.ndarray = slice(int(slots[0]), int(slots[0]) + k) if contiguous else slots
        self._rows[target] = rows
        if self._scales is not None:
            assert scales is not None
            self._scales[target] = scales

    def _encoded(self, chunk: Chunk, at: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows ``at`` in the index's precision: as stored when the chunk has it, else converted."""
        if chunk.encoding == self.precision:
            # ``at`` is ascending (or deduplicated, then shorter): all rows in order means no gather
            if at.size == len(chunk) and at[0] == 0 and at[-1] == at.size - 1:
                return chunk.rows, chunk.scales
            return chunk.rows[at], (chunk.scales[at] if chunk.scales is not None else None)
        wide = chunk.decoded(at)
        if self.precision == "int8":
            return quantize_int8(wide)
        if self.precision == "float16":
            return normalize_rows(wide).astype(np.float16).view(np.int16), None
        return wide, None

    # ------------------------------------------------------------------ result

    def result(self) -> Matched:
        self._flush()
        n = self._n
        staged = np.flatnonzero(self._slot >= 0)  # distinct keys found
        slot_group = np.empty(n, dtype=np.int64)
        slot_group[self._slot[staged]] = staged
        first_pos = np.flatnonzero(self._first)  # sorted position of each group's first fragment
        fids = self._sorted_fids[first_pos[slot_group]]
        others = np.flatnonzero(~self._first)
        others = others[self._slot[self._group[others]] >= 0]
        extra_fids = self._sorted_fids[others]
        extra_rows = self._slot[self._group[others]]
        m = n + len(others)
        self._rows[n:m] = self._rows[extra_rows]
        if self._scales is not None:
            self._scales[n:m] = self._scales[extra_rows]
        rows = self._rows[:m] if m > 0.9 * len(self._rows) else self._rows[:m].copy()
        scales = None if self._scales is None else self._scales[:m].copy()
        self._rows = np.empty((0, self.dims), dtype=self._rows.dtype)
        all_groups = np.concatenate([slot_group, self._group[others]])
        all_fids = np.concatenate([fids, extra_fids])
        return Matched(
            fids=all_fids.tolist(), rows=rows, scales=scales,
            pair_fids=all_fids, pair_keys=self._ukeys[all_groups], seen=self.seen, legacy=self.legacy,
        )


def _halves(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Lower-case hex S32 keys as (upper, lower) 64-bit values; None if one is not hex."""
    if not keys.size:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    text = np.ascontiguousarray(keys).tobytes()
    try:
        raw = bytes.fromhex(text.decode("ascii"))
    except ValueError:
        return None
    if len(raw) != 16 * keys.size or raw.hex().encode("ascii") != text:  # lower-case hex only: sorts as its value
        return None
    pairs = np.frombuffer(raw, dtype=">u8").reshape(-1, 2).astype(np.uint64)
    return pairs[:, 0], pairs[:, 1]


def short_keys(keys: np.ndarray) -> np.ndarray:
    """``int(key[:16], 16)`` of each S32 hex content key, as uint64 (for the holder map)."""
    if not keys.size:
        return np.empty(0, dtype=np.uint64)
    raw = bytes.fromhex(np.ascontiguousarray(keys).tobytes().decode("ascii"))
    return np.frombuffer(raw, dtype=">u8").reshape(-1, 2)[:, 0].astype(np.uint64)


def key_arrays(keys: Mapping[int, str]) -> tuple[np.ndarray, np.ndarray]:
    """``(fids int64, content keys S32)`` of a fid -> key map: the wanted keys of a :class:`SidecarMatch`."""
    return (np.fromiter(keys.keys(), dtype=np.int64, count=len(keys)),
            np.array(list(keys.values()), dtype=_KEY) if keys else np.empty(0, dtype=_KEY))


__all__ = ["Matched", "SidecarMatch", "key_arrays", "short_keys"]
