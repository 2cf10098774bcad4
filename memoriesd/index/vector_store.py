"""Sealed vector sidecars: computed vectors kept at rest so unlock or restart reloads them.

One file per (vault, model identity) in the vault directory, named from an opaque
id the caller derives with the vault key (``vectors-<id>.bin``), so the name reveals
neither the model nor any text. Encryption is the caller's: ``seal``/``open_``
callables bound to the vault key. The file holds nothing in plaintext but an
8-byte magic/version, two fixed-size commit slots and the length of each chunk:

    MAGIC (8) | slot 0 (256) | slot 1 (256) | { u32 length | sealed chunk }*

A chunk is many ``(key, vector)`` entries sealed with aad = vault id + model
identity + dims + chunk number. Appends add chunks at the end, fsync, then write
a sealed commit record (generation, chunk count, end offset, hash chain over the
chunks) into the slot the previous commit did not use, and fsync again: a crash
mid-append leaves the previous commit valid (the uncommitted tail is dropped), a
cut or spliced file fails the commit check. Entries are content-addressed: the key is a
keyed hash of exactly what the model reads (:func:`content_key`: title or none, text), the
identity is in the aad, so even an old copy of the file can only hold correct vectors, and two
fragments with the same input (an edit that moved a paragraph, a passage in two notes) share one
entry. ``rewrite`` compacts into a new file (O_EXCL 0600, fsync, rename, fsync dir); ``retain``
rewrites it with only the entries of live fragments (``vault compact``); ``scan`` hands the
entries over a chunk at a time (unlock's load, without a float32 copy of the file). Files written before
content keys hold :func:`entry_key` keys (fingerprint + title hash); the caller re-keys them once
(``rename``) without re-embedding.

A sidecar cannot be opened without its model identity and dimensions (they are in the
aad), and its name is a keyed hash of the identity. So the vault directory also holds
``vector-spaces.bin``: one sealed record (aad = vault id) listing, per sidecar id, the
identity, dimensions and last use. It lets compaction filter the sidecars of every
model the vault used, and status count sealed vectors before the model is loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import struct
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import MemoriesError
from ..vault import fsio
from ..vault.format import atomic_write, fsync_dir

log = logging.getLogger("memoriesd.vectors")

MAGIC = b"MEMVEC\x00\x01"
SLOT_SIZE = 256
HEADER_SIZE = len(MAGIC) + 2 * SLOT_SIZE
CHUNK_ENTRIES = 2048
_COMMIT = struct.Struct(">QQQ32s")  # generation, chunks, end offset, chain
_FRAME = struct.Struct(">I")
_OPAQUE_ID = re.compile(r"[A-Za-z0-9_-]{8,128}")

Seal = Callable[[bytes, bytes], bytes]
Open = Callable[[bytes, bytes], bytes]


#: Hex characters of a content key (128 bits).
CONTENT_KEY_HEX = 32
_CONTENT_LABEL = b"memories/v2/vector-input\0"


def content_key(key: bytes | bytearray, title: str | None, text: str) -> str:
    """Key of a vector: HMAC-SHA256 under ``key`` (the vault's fingerprint subkey) over exactly what
    the embedder reads, ``(title or None, text)``, each part length-prefixed (no two inputs share an
    encoding). Identical model input gives the identical key, whatever the record or byte offsets:
    an edit re-embeds only the fragments whose input changed."""
    parts = [_CONTENT_LABEL]
    if title is None:
        parts.append(b"\0")
    else:
        raw = title.encode("utf-8")
        parts.append(b"\1" + struct.pack(">Q", len(raw)) + raw)
    data = text.encode("utf-8")
    parts.append(struct.pack(">Q", len(data)) + data)
    return hmac.digest(key, b"".join(parts), "sha256").hex()[:CONTENT_KEY_HEX]


def entry_key(fingerprint: str, title: str | None) -> str:
    """The key of sidecars written before content keys: fragment fingerprint (byte offsets +
    bytes) plus a hash of the record's title. Only used to re-key such files (see
    :func:`is_legacy_key`)."""
    digest = hashlib.sha256(b"memories/v1/vector-title\0" + (title or "").encode("utf-8")).hexdigest()
    return f"{fingerprint}.{digest[:32]}"


def is_legacy_key(key: str) -> bool:
    """Whether ``key`` is an :func:`entry_key` (old scheme), not a :func:`content_key`."""
    return "." in key


def sidecar_path(vault_dir: Path, opaque_id: str) -> Path:
    """``vault_dir/vectors-<opaque_id>.bin``; the id must be a keyed hash the caller computed."""
    if not _OPAQUE_ID.fullmatch(opaque_id):
        raise ValueError("opaque_id must be 8-128 characters of [A-Za-z0-9_-]")
    return Path(vault_dir) / f"vectors-{opaque_id}.bin"


def list_sidecars(vault_dir: Path) -> list[Path]:
    """Every vector sidecar in a vault directory (to remove those of models no longer used)."""
    return sorted(p for p in Path(vault_dir).glob("vectors-*.bin") if p.is_file())


def sidecar_opaque_id(path: Path) -> str:
    """The opaque id in a sidecar's file name (inverse of :func:`sidecar_path`)."""
    return Path(path).name[len("vectors-") : -len(".bin")]


# -- the list of vector spaces (identity and dimensions of each sidecar) ---------------------

SPACES_NAME = "vector-spaces.bin"
_SPACES_MAGIC = b"MEMVSP\x00\x01"


def _spaces_aad(vault_id: str) -> bytes:
    return b"memories/v1/vector-spaces\0" + vault_id.encode("utf-8")


def read_spaces(vault_dir: Path, *, vault_id: str, open_: Open) -> dict[str, dict[str, object]]:
    """``{opaque id: {"identity", "dims", "used"}}`` from ``vector-spaces.bin``; {} when it is
    missing or unreadable (derived data: never raises)."""
    path = Path(vault_dir) / SPACES_NAME
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    try:
        if data[: len(_SPACES_MAGIC)] != _SPACES_MAGIC:
            raise _Damage("not a vector space list of this version")
        doc = json.loads(open_(data[len(_SPACES_MAGIC) :], _spaces_aad(vault_id)))
        out: dict[str, dict[str, object]] = {}
        for oid, entry in dict(doc["spaces"]).items():
            if _OPAQUE_ID.fullmatch(str(oid)) and isinstance(entry.get("identity"), str) and int(entry["dims"]) > 0:
                out[str(oid)] = {"identity": entry["identity"], "dims": int(entry["dims"]), "used": float(entry.get("used", 0))}
        return out
    except Exception as exc:
        log.warning("vector space list %s is damaged (%s); ignored", SPACES_NAME, _damage_reason(exc))
        return {}


def write_spaces(vault_dir: Path, spaces: Mapping[str, Mapping[str, object]], *, vault_id: str, seal: Seal) -> None:
    """Replace ``vector-spaces.bin`` atomically (temp file 0600, fsync, rename, fsync dir)."""
    plain = json.dumps({"spaces": {k: dict(v) for k, v in spaces.items()}}, sort_keys=True).encode("utf-8")
    atomic_write(Path(vault_dir) / SPACES_NAME, _SPACES_MAGIC + seal(plain, _spaces_aad(vault_id)))


def rekeyed(entries: Mapping[str, np.ndarray], rename: Mapping[str, str]) -> dict[str, np.ndarray]:
    """``entries`` with old-scheme keys replaced as ``rename`` says (an entry already under the new
    key wins); old-scheme keys ``rename`` does not know are dropped (no live fragment has them)."""
    out = {k: v for k, v in entries.items() if not is_legacy_key(k)}
    for k, v in entries.items():
        if is_legacy_key(k):
            new = rename.get(k)
            if new is not None and new not in out:
                out[new] = v
    return out


class _Damage(Exception):
    """The file is not a readable sidecar of this vault and model (reason is safe to log)."""


class _TakeFailed(Exception):
    """The caller's ``take`` raised during :meth:`VectorStore.scan` (not damage: re-raised as is)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


def _damage_reason(exc: Exception) -> str:
    """Why a file could not be parsed, safe to log (never its content)."""
    return str(exc) if isinstance(exc, _Damage) else f"unreadable: {type(exc).__name__}"


@dataclass(frozen=True)
class _State:
    generation: int
    chunks: int
    end: int
    chain: bytes
    slot: int  # the slot holding the current commit


def _chain(prev: bytes, blob: bytes) -> bytes:
    return hashlib.sha256(prev + hashlib.sha256(blob).digest()).digest()


def _digest(blob: bytes) -> bytes:
    return hashlib.sha256(blob).digest()


class VectorStore:
    """The sealed vector sidecar of one vault and one model identity."""

    def __init__(self, path: Path, *, vault_id: str, identity: str, dims: int, seal: Seal, open_: Open) -> None:
        if dims <= 0:
            raise ValueError("dims must be positive")
        self.path = Path(path)
        self.dims = dims
        self._seal = seal
        self._open = open_
        vid, ident = vault_id.encode(), identity.encode()
        self._aad = (
            b"memories/v1/vectors\0"
            + struct.pack(">H", len(vid)) + vid
            + struct.pack(">H", len(ident)) + ident
            + struct.pack(">I", dims)
        )
        self._state: _State | None = None
        self._lock = threading.Lock()

    # -- format ------------------------------------------------------------------------------

    def _chunk_aad(self, number: int) -> bytes:
        return self._aad + b"chunk" + struct.pack(">Q", number)

    def _slot_aad(self, slot: int) -> bytes:
        return self._aad + b"commit" + bytes([slot])

    def _encode_chunk(self, items: list[tuple[str, np.ndarray]]) -> bytes:
        parts = [struct.pack(">I", len(items))]
        for key, _ in items:
            raw = key.encode("utf-8")
            if len(raw) > 0xFFFF:
                raise ValueError("vector entry key is too long")
            parts.append(struct.pack(">H", len(raw)) + raw)
        matrix = np.stack([v for _, v in items]).astype("<f4", copy=False)
        parts.append(matrix.tobytes())
        return b"".join(parts)

    def _chunk_rows(self, data: bytes) -> tuple[list[str], np.ndarray]:
        """A chunk's keys and its (count, dims) little-endian float32 rows, a read-only view of ``data``."""
        if len(data) < 4:
            raise _Damage("a chunk is too short")
        (count,) = struct.unpack_from(">I", data, 0)
        keys = self._content_keys(data, count)
        if keys is not None:  # all of them content keys (32 hex characters): sliced from one string
            pos = 4 + count * (2 + CONTENT_KEY_HEX)
            if len(data) - pos != count * self.dims * 4:
                raise _Damage("a chunk's vectors do not match its entries")
            return keys, np.frombuffer(data, dtype="<f4", offset=pos).reshape(count, self.dims)
        pos = 4
        keys = []
        for _ in range(count):
            if pos + 2 > len(data):
                raise _Damage("a chunk's keys are cut short")
            (n,) = struct.unpack_from(">H", data, pos)
            keys.append(data[pos + 2 : pos + 2 + n].decode("utf-8"))
            pos += 2 + n
        if len(data) - pos != count * self.dims * 4:
            raise _Damage("a chunk's vectors do not match its entries")
        return keys, np.frombuffer(data, dtype="<f4", offset=pos).reshape(count, self.dims)

    @staticmethod
    def _content_keys(data: bytes, count: int) -> list[str] | None:
        """The chunk's keys when every one is a :data:`CONTENT_KEY_HEX`-character ASCII key (what
        this version writes), without one ``struct`` call per key; None otherwise."""
        width = 2 + CONTENT_KEY_HEX
        if not count or len(data) < 4 + count * width:
            return None
        block = np.frombuffer(data, dtype=np.uint8, count=count * width, offset=4).reshape(count, width)
        if not ((block[:, 0] == 0).all() and (block[:, 1] == CONTENT_KEY_HEX).all() and (block[:, 2:] < 128).all()):
            return None
        text = data[4 : 4 + count * width].decode("ascii")
        return [text[i + 2 : i + width] for i in range(0, count * width, width)]

    def _decode_chunk(self, data: bytes, into: dict[str, np.ndarray]) -> None:
        keys, rows = self._chunk_rows(data)
        matrix = rows.astype(np.float32)
        for key, row in zip(keys, matrix, strict=True):
            into[key] = row

    def _commit_bytes(self, state: _State) -> bytes:
        plain = _COMMIT.pack(state.generation, state.chunks, state.end, state.chain)
        blob = self._seal(plain, self._slot_aad(state.slot))
        if len(blob) + 2 > SLOT_SIZE:
            raise ValueError("the seal function's overhead does not fit a commit slot")
        return (struct.pack(">H", len(blob)) + blob).ljust(SLOT_SIZE, b"\0")

    def _read_commit(self, data: bytes) -> _State:
        best: _State | None = None
        for slot in (0, 1):
            start = len(MAGIC) + slot * SLOT_SIZE
            (n,) = struct.unpack_from(">H", data, start)
            if n == 0 or n > SLOT_SIZE - 2:
                continue
            try:
                plain = self._open(data[start + 2 : start + 2 + n], self._slot_aad(slot))
                gen, chunks, end, chain = _COMMIT.unpack(plain)
            except Exception:
                continue  # a torn or foreign slot: the other one may still be good
            if best is None or gen > best.generation:
                best = _State(gen, chunks, end, chain, slot)
        if best is None:
            raise _Damage("no valid commit record (another vault or model, or damage)")
        return best

    def _parse(self, data: bytes) -> tuple[_State, dict[str, np.ndarray]]:
        if len(data) < HEADER_SIZE or data[: len(MAGIC)] != MAGIC:
            raise _Damage("not a vector sidecar of this version")
        state = self._read_commit(data)
        if state.end > len(data):
            raise _Damage("the file is truncated")
        entries: dict[str, np.ndarray] = {}
        pos, chain = HEADER_SIZE, b""
        for number in range(state.chunks):
            if pos + 4 > state.end:
                raise _Damage("the chunks end before the commit record says")
            (n,) = _FRAME.unpack_from(data, pos)
            blob = data[pos + 4 : pos + 4 + n]
            if pos + 4 + n > state.end:
                raise _Damage("a chunk runs past the committed end")
            try:
                plain = self._open(blob, self._chunk_aad(number))
            except Exception as exc:
                raise _Damage(f"chunk {number} fails authentication") from exc
            chain = _chain(chain, blob)
            self._decode_chunk(plain, entries)
            pos += 4 + n
        if pos != state.end or chain != state.chain:
            raise _Damage("the chunks do not match the commit record")
        if len(data) > state.end:
            log.info("vector cache %s: dropping an uncommitted tail of %d bytes", self.path.name, len(data) - state.end)
        return state, entries

    def _frames(self, entries: Mapping[str, np.ndarray], first: int, chain: bytes) -> tuple[list[bytes], bytes]:
        items = [(k, self._vector(v)) for k, v in entries.items()]
        frames: list[bytes] = []
        for i in range(0, len(items), CHUNK_ENTRIES):
            blob = self._seal(self._encode_chunk(items[i : i + CHUNK_ENTRIES]), self._chunk_aad(first + len(frames)))
            chain = _chain(chain, blob)
            frames.append(_FRAME.pack(len(blob)) + blob)
        return frames, chain

    def _vector(self, v: np.ndarray) -> np.ndarray:
        arr = np.asarray(v, dtype=np.float32).reshape(-1)
        if arr.shape[0] != self.dims:
            raise ValueError(f"vector has {arr.shape[0]} dimensions, the store {self.dims}")
        return arr

    # -- public ------------------------------------------------------------------------------

    def load(self) -> dict[str, np.ndarray]:
        """Every stored vector by entry key. A damaged, truncated or foreign file is
        discarded with a WARNING and gives {}; this never raises."""
        with self._lock:
            try:
                parsed = self._read_committed()
            except OSError as exc:
                log.warning("vector cache %s cannot be read (%s); its vectors will be recomputed",
                            self.path.name, exc.strerror)
                return {}
            if parsed is None:
                return {}
            self._state, entries = parsed
            return entries

    def scan(self, take: Callable[[list[str], np.ndarray], None]) -> bool | None:
        """Every stored vector, a chunk at a time: ``take(keys, rows)`` per chunk in file order
        (``rows``: a read-only (n, dims) float32 view, valid during the call; a later duplicate key
        wins, as in :meth:`load`). The file is read a frame at a time, so memory holds one chunk,
        never the whole file or a float32 copy of every row.

        Returns True once every chunk was read and the commit record verified; None when there is
        no file; False when it cannot be read, or is damaged, truncated or foreign (then it is
        discarded with a WARNING, as :meth:`load` does): chunks already handed to ``take`` each
        authenticated, but the caller drops them, since the file as a whole is not trusted.
        Exceptions raised by ``take`` propagate (nothing is discarded)."""
        with self._lock:
            self._state = None
            try:
                f = open(self.path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                return None
            except OSError as exc:
                log.warning("vector cache %s cannot be read (%s); its vectors will be recomputed",
                            self.path.name, exc.strerror)
                return False
            with f:
                try:
                    state = self._scan(f, take)
                except _TakeFailed as failed:
                    raise failed.error from None
                except OSError as exc:
                    log.warning("vector cache %s cannot be read (%s); its vectors will be recomputed",
                                self.path.name, exc.strerror)
                    return False
                except Exception as exc:
                    log.warning("vector cache %s is damaged (%s); discarded, its vectors will be recomputed",
                                self.path.name, _damage_reason(exc))
                    self._discard()
                    return False
            self._state = state
            return True

    def _scan(self, f: BinaryIO, take: Callable[[list[str], np.ndarray], None]) -> _State:
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE or head[: len(MAGIC)] != MAGIC:
            raise _Damage("not a vector sidecar of this version")
        state = self._read_commit(head)
        size = os.fstat(f.fileno()).st_size
        if state.end > size:
            raise _Damage("the file is truncated")
        pos = HEADER_SIZE
        # The commit's hash chain is over every chunk's SHA-256: those are computed on another
        # thread (hashlib releases the GIL) while this one decrypts and hands chunks over.
        hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memoriesd-vechash")
        digests: list[Future[bytes]] = []
        try:
            for number in range(state.chunks):
                pos = self._scan_chunk(f, take, number, pos, state, hashing, digests)
            chain = b""
            for d in digests:
                chain = hashlib.sha256(chain + d.result()).digest()
        finally:
            hashing.shutdown(wait=True, cancel_futures=True)
        if pos != state.end or chain != state.chain:
            raise _Damage("the chunks do not match the commit record")
        if size > state.end:
            log.info("vector cache %s: dropping an uncommitted tail of %d bytes", self.path.name, size - state.end)
        return state

    def _scan_chunk(
        self, f: BinaryIO, take: Callable[[list[str], np.ndarray], None], number: int, pos: int, state: _State,
        hashing: ThreadPoolExecutor, digests: list[Future[bytes]],
    ) -> int:
        """Read, open and hand over chunk ``number`` at ``pos``; the position after it."""
        if pos + 4 > state.end:
            raise _Damage("the chunks end before the commit record says")
        (n,) = _FRAME.unpack(f.read(4))
        if pos + 4 + n > state.end:
            raise _Damage("a chunk runs past the committed end")
        blob = f.read(n)
        if len(blob) != n:
            raise _Damage("the file is truncated")
        digests.append(hashing.submit(_digest, blob))
        try:
            plain = self._open(blob, self._chunk_aad(number))
        except Exception as exc:
            raise _Damage(f"chunk {number} fails authentication") from exc
        keys, rows = self._chunk_rows(plain)
        try:
            take(keys, rows)
        except Exception as exc:
            raise _TakeFailed(exc) from exc
        return pos + 4 + n

    def append(self, entries: Mapping[str, np.ndarray]) -> None:
        """Add entries durably (fsync) before returning; later duplicates win on load."""
        if not entries:
            return
        with self._lock:
            if self._state is None and self.path.exists():
                try:
                    self._state, _ = self._parse(self.path.read_bytes())
                except Exception:
                    self._state = None  # unusable: start over with these entries
            if self._state is None:
                self._rewrite(entries)
                return
            state = self._state
            frames, chain = self._frames(entries, state.chunks, state.chain)
            self._state = None  # unknown until the commit is durable
            try:
                fd = fsio.open_fd(self.path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fsio.ftruncate(fd, state.end)  # drop an uncommitted tail
                    end = state.end
                    for frame in frames:
                        fsio.pwrite_all(fd, frame, end)
                        end += len(frame)
                    fsio.fsync(fd)
                    new = _State(state.generation + 1, state.chunks + len(frames), end, chain, 1 - state.slot)
                    fsio.pwrite_all(fd, self._commit_bytes(new), len(MAGIC) + new.slot * SLOT_SIZE)
                    fsio.fsync(fd)
                finally:
                    fsio.close(fd)
            except OSError as exc:
                raise self._write_error(exc) from exc
            self._state = new

    def rewrite(self, entries: Mapping[str, np.ndarray]) -> None:
        """Replace the file with exactly ``entries`` (compaction), atomically and durably."""
        with self._lock:
            self._rewrite(entries)

    def retain(self, keep: Collection[str], rename: Mapping[str, str] | None = None) -> tuple[int, int] | None:
        """Rewrite the file with only the entries whose key is in ``keep`` (compaction), atomically
        and durably; a file left with no entry is removed. ``rename`` (old key -> new key) re-keys
        entries first (old-scheme keys; an entry already under the new key wins). Returns (kept,
        dropped), or None when the file was damaged (then it is discarded, as :meth:`load` does) or
        missing."""
        with self._lock:
            try:
                parsed = self._read_committed()
            except OSError as exc:
                raise self._write_error(exc) from exc
            if parsed is None:
                return None
            entries = rekeyed(parsed[1], rename or {})
            kept = {k: v for k, v in entries.items() if k in keep}
            if kept:
                self._rewrite(kept)
            else:
                self._discard()
            return len(kept), len(entries) - len(kept)

    def peek_keys(self) -> set[str] | None:
        """The committed entry keys, read-only (never discards or changes state); None when the
        file is missing or unreadable."""
        try:
            data = self.path.read_bytes()
            _, entries = self._parse(data)
        except Exception:
            return None
        return set(entries)

    def discard(self) -> None:
        """Remove the sidecar (e.g. when the vault no longer uses this model)."""
        with self._lock:
            self._discard()

    # -- internals ---------------------------------------------------------------------------

    def _rewrite(self, entries: Mapping[str, np.ndarray]) -> None:
        frames, chain = self._frames(entries, 0, b"")
        end = HEADER_SIZE + sum(len(f) for f in frames)
        state = _State(1, len(frames), end, chain, 0)
        body = MAGIC + self._commit_bytes(state) + bytes(SLOT_SIZE) + b"".join(frames)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")
        self._state = None
        try:
            fd = fsio.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                fsio.write_all(fd, body)
                fsio.fsync(fd)
            finally:
                fsio.close(fd)
            fsio.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            try:
                fsio.unlink(tmp)
            except OSError:
                pass
            raise self._write_error(exc) from exc
        self._state = state

    def _read_committed(self) -> tuple[_State, dict[str, np.ndarray]] | None:
        """The file's commit state and entries; None when it is missing, or damaged (then it is
        discarded with a WARNING, its vectors to be recomputed). Read errors propagate. Caller
        holds the lock."""
        self._state = None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return self._parse(data)
        except Exception as exc:
            log.warning("vector cache %s is damaged (%s); discarded, its vectors will be recomputed",
                        self.path.name, _damage_reason(exc))
            self._discard()
            return None

    def _discard(self) -> None:
        self._state = None
        try:
            fsio.unlink(self.path)
            fsync_dir(self.path.parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("vector cache %s cannot be removed (%s)", self.path.name, exc.strerror)

    def _write_error(self, exc: OSError) -> MemoriesError:
        return MemoriesError(
            f"cannot write the vector cache {self.path.name} ({exc.strerror}): check free space and "
            "permissions of the vault directory; search still works, vectors are recomputed later",
            code="vector_store_failed",
        )
