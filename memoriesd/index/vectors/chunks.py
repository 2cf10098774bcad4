"""The plaintext of one sealed vector-sidecar chunk: its entry keys and rows, in an encoding.

A chunk of a version-2 sidecar (:mod:`memoriesd.index.vectors.sidecar`, ``docs/format.md``) holds its
rows in the representation the in-memory index keeps (``[index] vector_precision``), so unlock
copies them into the index as they are: no float32 decode, no re-quantising, and a quarter of
float32's bytes to read, open and hash for int8 (the default). Layout (integers big-endian)::

    v2 chunk = u8 encoding || u32 count || count x (u16 len || key UTF-8) || rows
    v1 chunk =                u32 count || count x (u16 len || key UTF-8) || rows (float32)

    encoding 0, float32: count x dims float32 little-endian (the embedder's vectors as given)
    encoding 1, int8:    count x float32 LE scale || count x dims int8 (``quantize_int8``: the
                         largest component is +-127, codes x scale is the unit-length direction)
    encoding 2, float16: count x dims IEEE half little-endian of the unit-length row

Decoding int8 or float16 and encoding again gives the same bytes (the codes of a decoded row are
its codes), so a rewrite (compaction, forget) loses nothing more. A row is never widened: a
rewrite keeps the narrowest encoding its entries were in (:func:`narrowest`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .matrix import normalize_rows, quantize_int8

#: Code of each encoding in a v2 chunk (index = code); the order is also widest first.
ENCODINGS = ("float32", "int8", "float16")
_WIDTH = {"float32": 4, "float16": 2, "int8": 1}
#: Hex characters of a content key (128 bits).
CONTENT_KEY_HEX = 32
_KEY_ENTRY = np.dtype([("n", ">u2"), ("key", f"S{CONTENT_KEY_HEX}")])


class ChunkDamage(Exception):
    """The chunk's plaintext does not parse (reason is safe to log)."""


def encoding_of_precision(precision: str) -> str:
    """The sidecar encoding that holds rows exactly as an index of ``precision`` does."""
    if precision not in _WIDTH:
        raise ValueError(f"unknown vector precision {precision!r}")
    return precision


def narrowest(a: str, b: str) -> str:
    """The narrower of two encodings (a rewrite never widens rows: it would gain no precision)."""
    return a if _WIDTH[a] <= _WIDTH[b] else b


def row_bytes(encoding: str, dims: int) -> int:
    """Bytes one entry's row takes in a chunk (int8 counts its scale)."""
    return dims * _WIDTH[encoding] + (4 if encoding == "int8" else 0)


@dataclass
class Chunk:
    """A parsed chunk: read-only views of its plaintext (valid while it is referenced)."""

    encoding: str
    rows: np.ndarray  # (count, dims): float32, int8 codes, or float16 bit patterns as int16
    scales: np.ndarray | None  # int8: (count,) float32
    key_array: np.ndarray | None  # (count,) S32 when every key is a content key, else None
    _keys: list[str] | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def keys(self) -> list[str]:
        """The entry keys as strings (computed once)."""
        if self._keys is None:
            assert self.key_array is not None
            self._keys = self.key_array.astype("U").tolist() if len(self.key_array) else []
        return self._keys

    def decoded(self, picks: np.ndarray | None = None) -> np.ndarray:
        """float32 rows (all, or those at ``picks``): a new array. int8 and float16 rows come back
        with unit length, float32 rows as stored."""
        rows = self.rows if picks is None else self.rows[picks]
        if self.encoding == "float32":
            return np.array(rows, dtype=np.float32)
        if self.encoding == "float16":
            return rows.view("<f2").astype(np.float32)
        assert self.scales is not None
        scales = self.scales if picks is None else self.scales[picks]
        out = rows.astype(np.float32)
        out *= scales.astype(np.float32)[:, None]
        return out


def encode_chunk(keys: list[str], vectors: np.ndarray, encoding: str, *, version: int = 2) -> bytes:
    """The plaintext of a chunk of ``keys`` with their float32 ``vectors`` (one row each)."""
    if version == 1 and encoding != "float32":
        raise ValueError("a version-1 chunk holds float32 rows only")
    parts = [bytes([ENCODINGS.index(encoding)])] if version == 2 else []
    parts.append(struct.pack(">I", len(keys)))
    for key in keys:
        raw = key.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ValueError("vector entry key is too long")
        parts.append(struct.pack(">H", len(raw)) + raw)
    arr = np.asarray(vectors, dtype=np.float32)
    if encoding == "float32":
        parts.append(arr.astype("<f4", copy=False).tobytes())
    elif encoding == "float16":
        parts.append(normalize_rows(arr).astype("<f2").tobytes())
    else:
        codes, scale = quantize_int8(arr)
        parts.append(scale.astype("<f4").tobytes())
        parts.append(codes.tobytes())
    return b"".join(parts)


def parse_chunk(data: bytes, dims: int, version: int) -> Chunk:
    """A chunk's keys and rows as read-only views of ``data`` (:class:`ChunkDamage` if malformed)."""
    pos = 0
    encoding = "float32"
    if version == 2:
        if len(data) < 1 or data[0] >= len(ENCODINGS):
            raise ChunkDamage("a chunk has an unknown encoding")
        encoding = ENCODINGS[data[0]]
        pos = 1
    if len(data) < pos + 4:
        raise ChunkDamage("a chunk is too short")
    (count,) = struct.unpack_from(">I", data, pos)
    pos += 4
    key_array = _content_keys(data, pos, count)
    keys: list[str] | None = None
    if key_array is not None:
        pos += count * _KEY_ENTRY.itemsize
    else:
        keys = []
        for _ in range(count):
            if pos + 2 > len(data):
                raise ChunkDamage("a chunk's keys are cut short")
            (n,) = struct.unpack_from(">H", data, pos)
            try:
                keys.append(data[pos + 2 : pos + 2 + n].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ChunkDamage("a chunk's keys are malformed") from exc
            pos += 2 + n
    if len(data) - pos != count * row_bytes(encoding, dims):
        raise ChunkDamage("a chunk's vectors do not match its entries")
    scales = None
    if encoding == "float32":
        rows = np.frombuffer(data, dtype="<f4", offset=pos, count=count * dims).reshape(count, dims)
    elif encoding == "float16":
        rows = np.frombuffer(data, dtype="<i2", offset=pos, count=count * dims).reshape(count, dims)
    else:
        scales = np.frombuffer(data, dtype="<f4", offset=pos, count=count)
        rows = np.frombuffer(data, dtype=np.int8, offset=pos + 4 * count, count=count * dims).reshape(count, dims)
    return Chunk(encoding, rows, scales, key_array, keys)


def _content_keys(data: bytes, pos: int, count: int) -> np.ndarray | None:
    """The chunk's keys as an S32 array view when every one is a :data:`CONTENT_KEY_HEX`-character
    ASCII key (what this version writes): no per-key Python work. None otherwise."""
    if not count or len(data) < pos + count * _KEY_ENTRY.itemsize:
        return None if count else np.empty(0, dtype=f"S{CONTENT_KEY_HEX}")
    block = np.frombuffer(data, dtype=_KEY_ENTRY, count=count, offset=pos)
    if not (block["n"] == CONTENT_KEY_HEX).all():
        return None
    keys = block["key"]
    raw = np.frombuffer(data, dtype=np.uint8, count=count * _KEY_ENTRY.itemsize, offset=pos).reshape(count, -1)[:, 2:]
    if (raw >= 128).any() or (raw == 0).any():  # ASCII, and no NUL an S32 view would drop
        return None
    return keys


__all__ = ["CONTENT_KEY_HEX", "ENCODINGS", "Chunk", "ChunkDamage", "encode_chunk", "encoding_of_precision",
           "narrowest", "parse_chunk", "row_bytes"]
