"""On-disk format of a vault directory.

::

    vaults/<vault_id>/header.json       KDF parameters, wrapped vault key, name, integrity tag (HMAC)
    vaults/<vault_id>/head.bin          sealed {epoch, count, log_bytes, last_hash}: the log's authenticated length
    vaults/<vault_id>/log-<epoch>.bin   append-only sealed records: [u32 length][nonce|ciphertext|tag]...
    vaults/<vault_id>/vectors-*.bin     sealed embedding sidecars (derived data)
    vaults/<vault_id>/vector-spaces.bin sealed list of the sidecars' model identities (derived data)
    vaults/<vault_id>/preserved-*.bin   sealed log bytes that unlock moved aside instead of deleting

Each log entry is AES-256-GCM sealed with associated data binding it to the vault id, the log
epoch, its sequence number and the hash chain of every entry before it, so an entry cannot be
moved, swapped, replayed or dropped without detection. The head is rewritten atomically after
every durable batch; a log cannot prove its own length, the head does.

The last entry of every group (the entries one head write covers) carries ``"g": 1`` inside its
sealed JSON, so the log itself says where complete writes end: on unlock, complete groups found
after the head (a crash between the log fsync and the head write, or an older head.bin put back)
are rolled forward, and the bytes of an incomplete one are moved to a ``preserved-*`` file,
never deleted.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import VaultCorrupt
from . import crypto, fsio

FORMAT_VERSION = 1
HEADER_NAME = "header.json"
HEAD_NAME = "head.bin"
LEN = struct.Struct(">I")
MAX_ENTRY_BYTES = 64 * 1024 * 1024
# Key set (to 1) inside the sealed entry that ends a group: the entries one head write covers (a
# group commit, or a whole compacted log). Record.from_entry and settings ignore it; logs written
# before it existed have no marker, and their prefix covered by the head reads as before.
GROUP_END = "g"
# Prefix of the files where recovery keeps log bytes it takes out of (or away from) the log.
PRESERVED_PREFIX = "preserved-"

# Bounds applied when KDF parameters are read back from a header (a hostile header must not make
# unlock allocate gigabytes or spin for minutes).
KDF_BOUNDS = {"memory_kib": (8, 1024 * 1024), "iterations": (1, 64), "lanes": (1, 64)}


def b64e(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64d(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def log_name(epoch: int) -> str:
    return f"log-{epoch:08d}.bin"


def fsync_dir(path: Path) -> None:
    fsio.fsync_dir(path)


class DirSyncFailed(OSError):
    """:func:`atomic_write` renamed the new file into place, then the directory fsync failed.

    The new content is what the file now reads, but whether the rename survives a power loss is
    unknown (the old content may come back). Callers that must know whether a rename happened
    (the vault head) tell this apart from every other ``OSError``, after which nothing was renamed.
    """

    renamed = True


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file (O_EXCL, 0600), fsync, rename, fsync dir.

    Raises :class:`DirSyncFailed` (an ``OSError``) when only the final directory fsync failed;
    any other error means ``path`` was not replaced.
    """
    replace_file(path, data)
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        raise DirSyncFailed(exc.errno, exc.strerror or "directory fsync failed", str(path)) from exc


def replace_file(path: Path, data: bytes) -> None:
    """The first steps of :func:`atomic_write`: temp file, fsync, rename; no directory fsync.

    For a caller that must know exactly whether the rename happened whatever fails next: when
    this returns, ``path`` reads ``data``; when it raises, ``path`` was not replaced.
    """
    tmp = path.with_name(f".{path.name}.{crypto.random_bytes(6).hex()}.tmp")
    fsio.write_new(tmp, data)
    try:
        fsio.replace(tmp, path)
    except BaseException:
        fsio.unlink(tmp, missing_ok=True)
        raise


# ---------------------------------------------------------------------------
# Header
# ---------------------------------------------------------------------------


VAULT_ID_RE = re.compile(r"^[a-z2-7]{12}$")


@dataclass
class Header:
    vault_id: str
    name: str
    created: float
    kdf: dict[str, Any]  # alg, memory_kib, iterations, lanes, salt (b64)
    wrap: str  # b64 of the sealed vault key
    mac: str = ""
    format: int = FORMAT_VERSION

    def body(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "vault_id": self.vault_id,
            "name": self.name,
            "created": self.created,
            "kdf": self.kdf,
            "wrap": self.wrap,
        }

    def wrap_aad(self) -> bytes:
        return b"memories/wrap/v1|" + canonical({"format": self.format, "vault_id": self.vault_id, "kdf": self.kdf})

    def to_bytes(self) -> bytes:
        doc = self.body()
        doc["mac"] = self.mac
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")

    def compute_mac(self, vault_key: bytes | bytearray) -> str:
        key = crypto.subkey(vault_key, crypto.LABEL_HEADER_MAC)
        try:
            return b64e(crypto.mac(key, canonical(self.body())))
        finally:
            crypto.wipe(key)

    def verify_mac(self, vault_key: bytes | bytearray) -> bool:
        try:
            return crypto.mac_equal(b64d(self.mac), b64d(self.compute_mac(vault_key)))
        except ValueError:
            return False


def read_header(vault_dir: Path, label: str) -> Header:
    """Parse a header strictly. Any malformation is ``vault_corrupt`` naming ``label``."""
    try:
        doc = json.loads((vault_dir / HEADER_NAME).read_bytes().decode("utf-8"))
        return parse_header(doc, vault_dir.name)
    except FileNotFoundError as exc:
        raise VaultCorrupt(f"vault {label} has no header file: restore the vault directory from a backup") from exc
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise VaultCorrupt(
            f"vault {label} is damaged (its header is invalid): restore the vault directory from a backup"
        ) from exc


def parse_header(doc: object, vault_id: str | None) -> Header:
    """A header from its JSON object, checked strictly (ValueError/KeyError/TypeError when invalid).
    ``vault_id`` None accepts any valid id (a sync target's copy, read before the vault exists here)."""
    if not isinstance(doc, dict) or set(doc) != {"format", "vault_id", "name", "created", "kdf", "wrap", "mac"}:
        raise ValueError("fields")
    if doc["format"] != FORMAT_VERSION:
        raise ValueError("format")
    kdf = doc["kdf"]
    if not isinstance(kdf, dict) or set(kdf) != {"alg", "memory_kib", "iterations", "lanes", "salt"}:
        raise ValueError("kdf")
    if kdf["alg"] != "argon2id":
        raise ValueError("alg")
    for k, (lo, hi) in KDF_BOUNDS.items():
        v = kdf[k]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(k)
    if kdf["memory_kib"] < 8 * kdf["lanes"]:
        raise ValueError("memory")
    if len(b64d(kdf["salt"])) != crypto.SALT_BYTES:
        raise ValueError("salt")
    if not isinstance(doc["vault_id"], str) or not isinstance(doc["name"], str):
        raise ValueError("ids")
    if vault_id is not None and doc["vault_id"] != vault_id:
        raise ValueError("vault id")
    if vault_id is None and not VAULT_ID_RE.match(doc["vault_id"]):
        raise ValueError("vault id")
    if not isinstance(doc["created"], (int, float)) or isinstance(doc["created"], bool):
        raise ValueError("created")
    b64d(doc["wrap"])
    b64d(doc["mac"])
    return Header(
        vault_id=doc["vault_id"],
        name=doc["name"],
        created=float(doc["created"]),
        kdf=dict(kdf),
        wrap=doc["wrap"],
        mac=doc["mac"],
    )


# ---------------------------------------------------------------------------
# Head and log entries
# ---------------------------------------------------------------------------


@dataclass
class Head:
    epoch: int
    count: int
    log_bytes: int
    last_hash: bytes


def head_aad(vault_id: str) -> bytes:
    return b"memories/head/v1|" + vault_id.encode("utf-8")


def seal_head(sealer: crypto.Sealer, vault_id: str, head: Head) -> bytes:
    doc = {
        "vault_id": vault_id,
        "epoch": head.epoch,
        "count": head.count,
        "log_bytes": head.log_bytes,
        "last_hash": head.last_hash.hex(),
    }
    return b"MEMH1\n" + sealer.seal(canonical(doc), head_aad(vault_id))


def open_head(sealer: crypto.Sealer, vault_id: str, blob: bytes) -> Head:
    if not blob.startswith(b"MEMH1\n"):
        raise ValueError("head magic")
    doc = json.loads(sealer.open(blob[6:], head_aad(vault_id)))
    if doc.get("vault_id") != vault_id:
        raise ValueError("head vault")
    head = Head(int(doc["epoch"]), int(doc["count"]), int(doc["log_bytes"]), bytes.fromhex(doc["last_hash"]))
    if head.epoch < 0 or head.count < 0 or head.log_bytes < 0 or len(head.last_hash) != 32:
        raise ValueError("head values")
    return head


def chain_start(vault_id: str, epoch: int) -> bytes:
    return crypto.digest(b"memories/chain/v1|" + vault_id.encode("utf-8") + struct.pack(">Q", epoch))


_SEQ = struct.Struct(">QQ")


def entry_aad(vault_id: str, epoch: int, seq: int, prev_hash: bytes) -> bytes:
    return b"memories/rec/v1|" + vault_id.encode("utf-8") + b"|" + _SEQ.pack(epoch, seq) + prev_hash


def next_hash(prev_hash: bytes, blob: bytes | memoryview) -> bytes:
    """SHA-256 of ``prev_hash || blob`` (``blob`` may be a memoryview: nothing is concatenated)."""
    return crypto.digest_pair(prev_hash, blob)


def entry_plaintext(entry: dict[str, Any]) -> bytes:
    """The JSON an entry is sealed as (raises ``UnicodeError``/``TypeError`` for what cannot be encoded)."""
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def seal_entry(sealer: crypto.Sealer, vault_id: str, epoch: int, seq: int, prev: bytes, plaintext: bytes) -> bytes:
    """Framed sealed entry (length prefix + blob) of an encoded entry."""
    blob = sealer.seal(plaintext, entry_aad(vault_id, epoch, seq, prev))
    return LEN.pack(len(blob)) + blob


def encode_entry(sealer: crypto.Sealer, vault_id: str, epoch: int, seq: int, prev: bytes, entry: dict[str, Any]) -> bytes:
    """Framed sealed entry (length prefix + blob)."""
    return seal_entry(sealer, vault_id, epoch, seq, prev, entry_plaintext(entry))


@dataclass
class TailGroup:
    """A complete group found after the head: its entries and the head that would cover it."""

    entries: list[dict[str, Any]]
    end: Head


def decode_tail(sealer: crypto.Sealer, vault_id: str, data: bytes, head: Head) -> tuple[list[TailGroup], int]:
    """Complete groups written after ``head`` (entries that authenticate and chain on from it,
    up to and including an entry marked :data:`GROUP_END`), and the offset where the rest starts.

    Everything from that offset on is a torn or unmarked (legacy) write: it is never applied.
    Decoding stops at the first entry that does not frame, authenticate or parse.
    """
    groups: list[TailGroup] = []
    pending: list[dict[str, Any]] = []
    pos, seq, prev = head.log_bytes, head.count, head.last_hash
    kept = pos
    while pos + LEN.size <= len(data):
        (n,) = LEN.unpack_from(data, pos)
        if n < crypto.SEAL_OVERHEAD or n > MAX_ENTRY_BYTES or pos + LEN.size + n > len(data):
            break
        blob = data[pos + LEN.size : pos + LEN.size + n]
        try:
            entry = json.loads(sealer.open(blob, entry_aad(vault_id, head.epoch, seq, prev)).decode("utf-8"))
        except (crypto.CryptoFailure, ValueError, UnicodeDecodeError):
            break
        if not isinstance(entry, dict):
            break
        pending.append(entry)
        prev = next_hash(prev, blob)
        pos += LEN.size + n
        seq += 1
        if entry.get(GROUP_END) == 1:
            groups.append(TailGroup(pending, Head(head.epoch, seq, pos, prev)))
            pending = []
            kept = pos
    return groups, kept


def decode_full_log(sealer: crypto.Sealer, vault_id: str, epoch: int, data: bytes) -> list[dict[str, Any]] | None:
    """Every entry of a whole log file, or None unless all of its bytes decode as one chain."""
    start = Head(epoch, 0, 0, chain_start(vault_id, epoch))
    groups, kept = decode_tail(sealer, vault_id, data, start)
    if kept != len(data):
        return None
    return [entry for group in groups for entry in group.entries]


def decode_log(
    sealer: crypto.Sealer, vault_id: str, epoch: int, data: bytes, head: Head, label: str
) -> list[dict[str, Any]]:
    """Entries of the acknowledged prefix of a log; anything not matching the head is corruption."""

    def corrupt(why: str) -> VaultCorrupt:
        return VaultCorrupt(f"vault {label} is damaged ({why}): restore the vault directory from a backup")

    if len(data) < head.log_bytes:
        raise corrupt("its log is shorter than its head records")
    pos = 0
    prev = chain_start(vault_id, epoch)
    out: list[dict[str, Any]] = []
    seq = 0
    view = memoryview(data)  # entries are opened and hashed in place: no per-entry copy
    aad_prefix = b"memories/rec/v1|" + vault_id.encode("utf-8") + b"|"
    pack = _SEQ.pack
    loads = json.loads
    while pos < head.log_bytes:
        if pos + LEN.size > head.log_bytes:
            raise corrupt("a log entry is cut")
        (n,) = LEN.unpack_from(data, pos)
        if n < crypto.SEAL_OVERHEAD or n > MAX_ENTRY_BYTES or pos + LEN.size + n > head.log_bytes:
            raise corrupt("a log entry has an invalid length")
        blob = view[pos + LEN.size : pos + LEN.size + n]
        try:
            plaintext = sealer.open(blob, aad_prefix + pack(epoch, seq) + prev)  # = entry_aad(...)
            entry = loads(plaintext.decode("utf-8"))
        except (crypto.CryptoFailure, ValueError, UnicodeDecodeError) as exc:
            raise corrupt("a log entry failed authentication") from exc
        if not isinstance(entry, dict):
            raise corrupt("a log entry is malformed")
        out.append(entry)
        prev = next_hash(prev, blob)
        pos += LEN.size + n
        seq += 1
    if seq != head.count or not crypto.mac_equal(prev, head.last_hash):
        raise corrupt("its log does not match its head")
    return out
