"""What a sync target holds, byte for byte: sealed files under names that say nothing.

A target is one flat folder (or rclone path) with:

- ``memories-sync.json``: the vault's header as the target keeps it (:func:`target_header_bytes`):
  the wrapped key and KDF parameters, its name sealed; a passphrase change replaces it;
- files named by 32 hex characters (a keyed hash, :meth:`Codec.name`), each ``MAGIC || kind ||
  sealed(padded zlib of a JSON object)``. Kinds: ``s`` a *segment* (a device's versions, numbered
  per device and chained by hash), ``t`` a device's *tip* (its last segment, what it has applied
  of the others, when it was last seen), ``e`` an *epoch marker* (a compaction that rewrote the
  target). The name is checked against the fields inside once opened, so a file copied under
  another name (or from another vault) is refused, never applied.

Plaintexts are padded to size buckets (:func:`bucket`) before sealing, so a target learns sizes
only to within 128 bytes (small files) or an eighth (large ones), and counts and timing. Nothing else travels: no index, vector, title or
file name in clear.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from ..vault import crypto
from ..vault.format import Header, b64d, b64e, canonical, parse_header
from ..vault.keys import VaultKeys

HEADER_FILE = "memories-sync.json"
NAME_RE = re.compile(r"^[0-9a-f]{32}$")
MAGIC = b"MEMSYNC1"
SEGMENT, TIP, EPOCH = "s", "t", "e"
KINDS = (SEGMENT, TIP, EPOCH)
#: The largest plaintext of one segment before compression (a push splits into several).
SEGMENT_PLAIN_BYTES = 4 << 20
#: A target file larger than this is not read (a segment is at most a few MiB).
MAX_FILE_BYTES = 64 << 20


class Unreadable(Exception):
    """A target file that does not open: incomplete (still arriving), damaged, or not this vault's."""


def bucket(n: int) -> int:
    """The padded size of a plaintext of ``n`` bytes: a multiple of 128 bytes up to 2 KiB, then one
    of eight steps per doubling (at most 12.5% more). Small steps keep a one-note edit near its log
    size (a 1 KiB floor made it 3x); a target still learns a small file's size only to 128 bytes."""
    if n <= 2048:
        return max(128, -(-n // 128) * 128)
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def whole_size(n: int) -> bool:
    """Whether a target file of ``n`` bytes has the size of a whole sealed file (a padded bucket):
    one that does not open then is damaged or not this vault's, not a file still arriving."""
    padded = n - len(MAGIC) - 1 - crypto.SEAL_OVERHEAD
    return padded >= 128 and bucket(padded) == padded


def _pad(plain: bytes) -> bytes:
    body = zlib.compress(plain, 6)
    framed = struct.pack(">I", len(body)) + body
    return framed + bytes(bucket(len(framed)) - len(framed))


def _unpad(padded: bytes) -> bytes:
    if len(padded) < 4:
        raise Unreadable("short")
    (n,) = struct.unpack(">I", padded[:4])
    if n > len(padded) - 4 or any(padded[4 + n :]):
        raise Unreadable("padding")
    try:
        return zlib.decompress(padded[4 : 4 + n])
    except zlib.error as exc:
        raise Unreadable("compression") from exc


@dataclass(frozen=True)
class Opened:
    """A target file that opened: its kind, its object, and the SHA-256 of its bytes (hex)."""

    kind: str
    doc: dict[str, Any]
    digest: str


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Codec:
    """Seals and opens one vault's target files and names them (keys from the vault's purpose keys)."""

    def __init__(self, keys: VaultKeys, vault_id: str) -> None:
        self.vault_id = vault_id
        self._sealer = keys.sealer(crypto.LABEL_SYNC)
        self._names = keys.subkey(crypto.LABEL_SYNC_NAMES)

    def wipe(self) -> None:
        self._sealer.wipe()
        crypto.wipe(self._names)

    def _aad(self, kind: str) -> bytes:
        return b"memories/sync/v1|" + self.vault_id.encode("ascii") + b"|" + kind.encode("ascii")

    def name(self, *parts: object) -> str:
        """The file name of ``parts`` (e.g. ``("s", device, epoch, seq)``): 32 hex of a keyed hash."""
        return crypto.mac(self._names, canonical(list(parts))).hex()[:32]

    def segment_name(self, device: str, epoch: int, seq: int) -> str:
        return self.name(SEGMENT, device, epoch, seq)

    def tip_name(self, device: str) -> str:
        return self.name(TIP, device)

    def epoch_name(self, epoch: int, device: str) -> str:
        return self.name(EPOCH, epoch, device)

    def expected_name(self, opened: Opened) -> str:
        d = opened.doc
        if opened.kind == SEGMENT:
            return self.segment_name(d["device"], d["epoch"], d["seq"])
        if opened.kind == TIP:
            return self.tip_name(d["device"])
        return self.epoch_name(d["epoch"], d["device"])

    def seal(self, kind: str, doc: dict[str, Any]) -> bytes:
        plain = json.dumps({**doc, "kind": kind, "vault": self.vault_id}, ensure_ascii=False, separators=(",", ":"))
        return MAGIC + kind.encode("ascii") + self._sealer.seal(_pad(plain.encode("utf-8")), self._aad(kind))

    def open(self, name: str, data: bytes) -> Opened:
        """Open a target file read under ``name``; :class:`Unreadable` when it is incomplete, damaged,
        another vault's, or was put under another name."""
        if len(data) < len(MAGIC) + 1 + crypto.SEAL_OVERHEAD or data[: len(MAGIC)] != MAGIC:
            raise Unreadable("not a sync file")
        kind = data[len(MAGIC) : len(MAGIC) + 1].decode("ascii", "replace")
        if kind not in KINDS:
            raise Unreadable("kind")
        try:
            plain = _unpad(self._sealer.open(data[len(MAGIC) + 1 :], self._aad(kind)))
            doc = json.loads(plain.decode("utf-8"))
        except (crypto.CryptoFailure, UnicodeDecodeError, ValueError) as exc:
            raise Unreadable("does not open") from exc
        if not isinstance(doc, dict) or doc.get("kind") != kind or doc.get("vault") != self.vault_id:
            raise Unreadable("misplaced")
        opened = Opened(kind, doc, digest(data))
        try:
            if self.expected_name(opened) != name:
                raise Unreadable("misplaced")
        except (KeyError, TypeError) as exc:
            raise Unreadable("malformed") from exc
        return opened

    def seal_name(self, name: str) -> str:
        return b64e(self._sealer.seal(name.encode("utf-8"), self._aad("name")))

    def open_name(self, sealed: str) -> str:
        try:
            return self._sealer.open(b64d(sealed), self._aad("name")).decode("utf-8")
        except (crypto.CryptoFailure, UnicodeDecodeError, ValueError) as exc:
            raise Unreadable("name") from exc


# ---------------------------------------------------------------------------- the target's header


@dataclass(frozen=True)
class TargetHeader:
    """``memories-sync.json``: the vault's header with an empty name (its MAC covers that), and the
    name sealed beside it."""

    header: Header
    sealed_name: str


def target_header_bytes(header: Header, sealed_name: str) -> bytes:
    doc = {"memories_sync": 1, "header": {**header.body(), "mac": header.mac}, "name": sealed_name}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def read_target_header(data: bytes) -> TargetHeader:
    """Parse ``memories-sync.json`` strictly; ValueError when it is not one."""
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict) or set(doc) != {"memories_sync", "header", "name"} or doc["memories_sync"] != 1:
            raise ValueError("fields")
        header = parse_header(doc["header"], None)
        if header.name != "" or not isinstance(doc["name"], str):
            raise ValueError("name")
        b64d(doc["name"])
        return TargetHeader(header, doc["name"])
    except (UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError("invalid") from exc


__all__ = [
    "Codec",
    "EPOCH",
    "HEADER_FILE",
    "NAME_RE",
    "Opened",
    "SEGMENT",
    "SEGMENT_PLAIN_BYTES",
    "TIP",
    "TargetHeader",
    "Unreadable",
    "bucket",
    "digest",
    "read_target_header",
    "target_header_bytes",
    "whole_size",
]
