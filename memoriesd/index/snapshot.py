"""The sealed lexical snapshot: the built BM25 index of a vault kept at rest, so unlock need not rebuild it.

One file per vault, ``vaults/<vault_id>/lexical-index.bin``. It holds two sections, each cut into
chunks of at most :data:`CHUNK_BYTES` and each chunk AES-256-GCM sealed with the vault's
``memories/v1/lexical-snapshot`` subkey:

- ``meta``: which record revisions the index holds and where their fragments are (record id,
  revision, first fragment id, each fragment's ordinal, byte range and fingerprint), the ids of
  the rows in the exact (per-Han-character) table and the next fragment id. No text: fragment text
  comes back from the unlocked vault's records by byte range, so nothing is re-fragmented;
- ``db``: the in-memory SQLite database of the two FTS5 tables as ``Connection.serialize()``
  returns it (segmented tokens with positions), so nothing is re-segmented.

Layout (all integers big-endian)::

    MAGIC (8) | u32 n | header (n bytes, canonical ASCII JSON) | { u32 length | sealed chunk }*

The header is not secret: the head values it names can be read off the log file by anyone (the
log's frame lengths are plaintext and its hash chain is over ciphertext), and ``version`` is a hash
of the tokenizer/schema identity. Every chunk's associated data is the header, the vault id, the
section and the chunk number, so a chunk cannot be moved, dropped, swapped between files or
vaults, or paired with another head or version; a file with a chunk missing, cut or appended fails
to read. Reading never trusts a file it cannot open: every failure is a :class:`SnapshotRejected`
with a reason safe to log, and the caller rebuilds.

Writing is atomic (temp file ``.lexical-index.bin.<random>.tmp``, O_EXCL 0600, fsync, rename, fsync
of the directory) and serialises in memory: no plaintext byte reaches the disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..text.segment import Segmentation
from ..vault import crypto, fsio
from ..vault.format import LEN, Head, canonical, chain_start, fsync_dir, log_name, next_hash

SNAPSHOT_NAME = "lexical-index.bin"
MAGIC = b"MEMLEX\x00\x01"
#: Bump whenever what the snapshot holds changes meaning: the FTS5 tables, their columns or row
#: contents (bm25.py), the segmentation (text/segment.py) or the meta fields. Part of :func:`version_tag`.
#: 2: the meta holds each fragment's vector content key ("ck"), so a change to what the embedder
#: reads (``docs.embed_input``) or to ``vectors.names.content_key`` needs a bump too.
#: 3: a card's fragments start after its front matter (``kinds.card.CardKind.body_start``): the byte ranges of a
#: schema-2 snapshot would bring it back into results.
SCHEMA = 3
CHUNK_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 4096
MAX_CHUNKS = 1 << 16  # 256 GiB at CHUNK_BYTES: a bound on what a hostile header can ask for
SECTIONS = ("meta", "db")
_U32 = struct.Struct(">I")


class SnapshotRejected(Exception):
    """The snapshot cannot be used; ``reason`` is safe to log (never content or key material)."""

    def __init__(self, reason: str, *, stale: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stale = stale  # a valid file built from an older state (not damage)


def snapshot_path(vault_dir: Path) -> Path:
    return Path(vault_dir) / SNAPSHOT_NAME


@functools.lru_cache(maxsize=4)
def version_tag(segmentation: Segmentation) -> str:
    """Identity of everything that decides what the stored rows mean, as a short hash.

    The schema number, the FTS5 tokenizer and Han handling, the SQLite version (its unicode61
    tables and FTS5 format) and jieba's version (its dictionary cuts Chinese text). A change to
    any of them makes an existing snapshot stale: it is rebuilt, never read with other rules.
    """
    try:
        from importlib.metadata import version

        jieba_version = version("jieba")
    except Exception:  # noqa: BLE001 - metadata missing: still a stable identity
        jieba_version = "unknown"
    ident = {
        "schema": SCHEMA,
        "tokenizer": segmentation.fts5_tokenizer,
        "han_only": segmentation.han_only,
        "sqlite": sqlite3.sqlite_version,
        "jieba": jieba_version,
    }
    return hashlib.sha256(canonical(ident)).hexdigest()[:32]


@dataclass
class SnapshotImage:
    """A snapshot's content in memory (plaintext: never written as is)."""

    head: Head
    meta: dict[str, Any]
    db: bytes


def _aad(vault_id: str, header: bytes, section: int, index: int) -> bytes:
    return (
        crypto.LABEL_LEXICAL_SNAPSHOT + b"\0" + vault_id.encode("utf-8") + b"\0" + header
        + struct.pack(">II", section, index)
    )


def _chunks(data: bytes) -> Iterator[memoryview]:
    view = memoryview(data)
    if not view:
        yield view
        return
    for i in range(0, len(view), CHUNK_BYTES):
        yield view[i : i + CHUNK_BYTES]


def _n_chunks(size: int) -> int:
    return max(1, -(-size // CHUNK_BYTES))


def _header(head: Head, version: str, counts: list[int]) -> bytes:
    return canonical(
        {
            "version": version,
            "epoch": head.epoch,
            "count": head.count,
            "log_bytes": head.log_bytes,
            "last_hash": head.last_hash.hex(),
            "chunks": counts,
        }
    )


def write_snapshot(
    vault_dir: Path,
    vault_id: str,
    sealer: crypto.Sealer,
    head: Head,
    version: str,
    meta: dict[str, Any],
    db: bytes,
) -> int:
    """Seal and atomically replace the vault's snapshot; returns the bytes written.

    Raises ``KeyWiped`` when the sealer's key was wiped (nothing is sealed under a wiped key) and
    ``OSError`` from the disk; then the previous file (if any) is untouched and the temp file removed.
    """
    meta_bytes = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    sections = (meta_bytes, db)
    header = _header(head, version, [_n_chunks(len(s)) for s in sections])
    path = snapshot_path(vault_dir)
    tmp = path.with_name(f".{path.name}.{crypto.random_bytes(6).hex()}.tmp")
    fd = fsio.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    total = 0
    try:
        try:
            fsio.write_all(fd, MAGIC + _U32.pack(len(header)) + header)
            total += len(MAGIC) + _U32.size + len(header)
            for s_no, data in enumerate(sections):
                for c_no, chunk in enumerate(_chunks(data)):
                    blob = sealer.seal(bytes(chunk), _aad(vault_id, header, s_no, c_no))
                    fsio.write_all(fd, _U32.pack(len(blob)) + blob)
                    total += _U32.size + len(blob)
            fsio.fsync(fd)
        finally:
            fsio.close(fd)
        fsio.replace(tmp, path)
    except BaseException:
        fsio.unlink(tmp, missing_ok=True)
        raise
    fsync_dir(Path(vault_dir))
    return total


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise SnapshotRejected("the file is cut short")
    return bytes(data)


def read_snapshot(
    vault_dir: Path, vault_id: str, sealer: crypto.Sealer, version: str, *, check: Callable[[], None] = lambda: None
) -> SnapshotImage:
    """Open the vault's snapshot, or raise :class:`SnapshotRejected` (missing, stale or damaged).

    ``check`` runs before each chunk (it raises to stop: the vault is locking)."""
    path = snapshot_path(vault_dir)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError as exc:
        raise SnapshotRejected("there is none", stale=True) from exc
    except OSError as exc:
        raise SnapshotRejected(f"it cannot be read ({exc.strerror or type(exc).__name__})") from exc
    try:
        with f:
            if _read_exact(f, len(MAGIC)) != MAGIC:
                raise SnapshotRejected("it is not a lexical snapshot of this format")
            (n,) = _U32.unpack(_read_exact(f, _U32.size))
            if not 2 <= n <= MAX_HEADER_BYTES:
                raise SnapshotRejected("its header is invalid")
            header = _read_exact(f, n)
            head, counts = _parse_header(header, version)
            sections: list[bytes] = []
            for s_no, count in enumerate(counts):
                parts: list[bytes] = []
                for c_no in range(count):
                    check()
                    (size,) = _U32.unpack(_read_exact(f, _U32.size))
                    if not crypto.SEAL_OVERHEAD <= size <= CHUNK_BYTES + crypto.SEAL_OVERHEAD:
                        raise SnapshotRejected("a chunk has an invalid length")
                    blob = _read_exact(f, size)
                    try:
                        parts.append(sealer.open(blob, _aad(vault_id, header, s_no, c_no)))
                    except crypto.CryptoFailure as exc:
                        raise SnapshotRejected("a chunk failed authentication (damaged, or not this vault's)") from exc
                sections.append(parts[0] if len(parts) == 1 else b"".join(parts))
                del parts
            if f.read(1):
                raise SnapshotRejected("it has bytes after its last chunk")
    except OSError as exc:
        raise SnapshotRejected(f"it cannot be read ({exc.strerror or type(exc).__name__})") from exc
    try:
        meta = json.loads(sections[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotRejected("its index description is malformed") from exc
    if not isinstance(meta, dict):
        raise SnapshotRejected("its index description is malformed")
    return SnapshotImage(head=head, meta=meta, db=sections[1])


def snapshot_head(vault_dir: Path, version: str) -> Head | None:
    """The head the vault's snapshot was built from, read off its plaintext header alone (nothing is
    decrypted); None when there is no snapshot, or none of this version, or its header is invalid."""
    try:
        with open(snapshot_path(vault_dir), "rb") as f:
            if _read_exact(f, len(MAGIC)) != MAGIC:
                return None
            (n,) = _U32.unpack(_read_exact(f, _U32.size))
            if not 2 <= n <= MAX_HEADER_BYTES:
                return None
            return _parse_header(_read_exact(f, n), version)[0]
    except (OSError, SnapshotRejected):
        return None


def _parse_header(header: bytes, version: str) -> tuple[Head, list[int]]:
    try:
        doc = json.loads(header.decode("ascii"))
        if not isinstance(doc, dict):
            raise ValueError("header")
        if doc.get("version") != version:
            raise SnapshotRejected("the tokenizer or index schema changed since it was written", stale=True)
        head = Head(int(doc["epoch"]), int(doc["count"]), int(doc["log_bytes"]), bytes.fromhex(doc["last_hash"]))
        counts = [int(c) for c in doc["chunks"]]
        if len(counts) != len(SECTIONS) or not all(1 <= c <= MAX_CHUNKS for c in counts):
            raise ValueError("chunks")
        if min(head.epoch, head.count, head.log_bytes) < 0 or len(head.last_hash) != 32:
            raise ValueError("head")
    except SnapshotRejected:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise SnapshotRejected("its header is invalid") from exc
    return head, counts


def remove_snapshot(vault_dir: Path) -> bool:
    """Delete the vault's snapshot (True when there was one)."""
    path = snapshot_path(vault_dir)
    try:
        fsio.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(Path(vault_dir))
    return True


def log_extends(vault_dir: Path, vault_id: str, old: Head, new: Head) -> bool:
    """Whether the log under ``new`` starts with exactly the entries ``old`` covered.

    Walks the frames of the log file up to ``old.log_bytes`` and recomputes the hash chain (over
    the sealed blobs; nothing is decrypted). True only when the epoch is the same, the walk ends
    on ``old``'s length after ``old.count`` entries, and the chain there equals ``old.last_hash``:
    then every record revision ``old`` saw is, byte for byte, in the current log.
    """
    if old.epoch != new.epoch or old.count > new.count or old.log_bytes > new.log_bytes:
        return False
    if old.count == new.count:
        return old.log_bytes == new.log_bytes and crypto.mac_equal(old.last_hash, new.last_hash)
    try:
        with open(Path(vault_dir) / log_name(old.epoch), "rb") as f:
            data = f.read(old.log_bytes)
    except OSError:
        return False
    if len(data) != old.log_bytes:
        return False
    view = memoryview(data)
    pos, seq, prev = 0, 0, chain_start(vault_id, old.epoch)
    while pos < old.log_bytes:
        if pos + LEN.size > old.log_bytes:
            return False
        (n,) = LEN.unpack_from(view, pos)
        end = pos + LEN.size + n
        if n < crypto.SEAL_OVERHEAD or end > old.log_bytes:
            return False
        prev = next_hash(prev, bytes(view[pos + LEN.size : end]))
        pos = end
        seq += 1
    return seq == old.count and crypto.mac_equal(prev, old.last_hash)


__all__ = [
    "SNAPSHOT_NAME",
    "SnapshotImage",
    "SnapshotRejected",
    "log_extends",
    "read_snapshot",
    "remove_snapshot",
    "snapshot_head",
    "snapshot_path",
    "version_tag",
    "write_snapshot",
]
