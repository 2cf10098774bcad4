"""Sealed vector sidecars: computed vectors kept at rest so unlock or restart reloads them.

One file per (vault, model identity) in the vault directory, named from an opaque
id the caller derives with the vault key (``vectors-<id>.bin``), so the name reveals
neither the model nor any text. Encryption is the caller's: ``seal``/``open_``
callables bound to the vault key. The file holds nothing in plaintext but an
8-byte magic/version, two fixed-size commit slots and the length of each chunk:

    MAGIC (8) | slot 0 (256) | slot 1 (256) | { u32 length | sealed chunk }*

A chunk is many ``(key, row)`` entries sealed with aad = format version + vault id +
model identity + dims + chunk number; its rows are in an encoding
(:mod:`~memoriesd.index.vectors.chunks`): the daemon writes them in the precision its index holds
(int8 codes and a scale per row by default), so unlock copies them in as they are. Version-1 files
(float32 rows only) are read, and :func:`.rewrite.repack` rewrites them (or rows written at a
wider precision, or a file of many small appended chunks) once, a chunk at a time. Appends add chunks at the end, fsync, then write
a sealed commit record (generation, chunk count, end offset, hash chain over the
chunks) into the slot the previous commit did not use, and fsync again: a crash
mid-append leaves the previous commit valid (the uncommitted tail is dropped), a
cut or spliced file fails the commit check. Entries are content-addressed: the key is a
keyed hash of exactly what the model reads (:func:`content_key`: title or none, text), the
identity is in the aad, so even an old copy of the file can only hold correct vectors, and two
fragments with the same input (an edit that moved a paragraph, a passage in two notes) share one
entry. ``rewrite`` compacts into a new file (O_EXCL 0600, fsync, rename, fsync dir); :func:`.rewrite.retain`
rewrites it with only the entries of live fragments (``vault compact``, ``memory forget``), never
widening rows; ``scan_chunks`` hands the entries over a chunk at a time as stored (unlock's load).
Files written before content keys hold :func:`entry_key` keys (fingerprint + title hash); the
caller re-keys them once (``rename``) without re-embedding.

File names and the space list (``vector-spaces.bin``: the identity and dimensions needed to open
each sidecar) are in :mod:`~memoriesd.index.vectors.names`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import struct
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ...errors import MemoriesError
from ...vault import fsio
from ...vault.crypto import KeyWiped
from ...vault.format import fsync_dir
from .chunks import Chunk, ChunkDamage, encode_chunk, narrowest, parse_chunk

log = logging.getLogger("memoriesd.vectors")

MAGIC = b"MEMVEC\x00\x02"  # version 2: each chunk names its rows' encoding (chunks.py)
MAGIC_V1 = b"MEMVEC\x00\x01"  # version 1: float32 rows only; read, and rewritten as version 2
SLOT_SIZE = 256
HEADER_SIZE = len(MAGIC) + 2 * SLOT_SIZE
CHUNK_ENTRIES = 2048
_COMMIT = struct.Struct(">QQQ32s")  # generation, chunks, end offset, chain
_FRAME = struct.Struct(">I")
_THREAD_HASH_BYTES = 256 * 1024  # chunks at least this large are hashed on another thread

Seal = Callable[[bytes, bytes], bytes]
Open = Callable[[bytes, bytes], bytes]


# Errors of this process, not of the file: opening a chunk or commit that raises one of these
# says nothing about the file, which must then be kept as it is (never discarded as damaged).
_NOT_DAMAGE = (MemoryError, KeyWiped)


class _Damage(Exception):
    """The file is not a readable sidecar of this vault and model (reason is safe to log)."""


class _TakeFailed(Exception):
    """The caller's ``take`` raised during :meth:`VectorStore.scan` (not damage: re-raised as is)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


def _damage_reason(exc: _Damage) -> str:
    """Why a file could not be parsed, safe to log (never its content)."""
    return str(exc)


@dataclass(frozen=True)
class _State:
    generation: int
    chunks: int
    end: int
    chain: bytes
    slot: int  # the slot holding the current commit
    version: int = 2  # the file's format version (MAGIC_V1: 1)


def _chain(prev: bytes, blob: bytes) -> bytes:
    return hashlib.sha256(prev + hashlib.sha256(blob).digest()).digest()


def _digest(blob: bytes) -> bytes:
    return hashlib.sha256(blob).digest()


class VectorStore:
    """The sealed vector sidecar of one vault and one model identity."""

    def __init__(
        self, path: Path, *, vault_id: str, identity: str, dims: int, seal: Seal, open_: Open, encoding: str = "float32",
    ) -> None:
        """``encoding``: how appended rows are written (``chunks.ENCODINGS``: the index's
        precision); a rewrite keeps rows at most as wide as the file had them (never widens)."""
        if dims <= 0:
            raise ValueError("dims must be positive")
        narrowest(encoding, encoding)  # validates the name
        self.path = Path(path)
        self.dims = dims
        self.encoding = encoding
        self._seal = seal
        self._open = open_
        vid, ident = vault_id.encode(), identity.encode()
        tail = struct.pack(">H", len(vid)) + vid + struct.pack(">H", len(ident)) + ident + struct.pack(">I", dims)
        # The version is in every AAD: a chunk or commit cannot be read as the other version's.
        self._aads = {1: b"memories/v1/vectors\0" + tail, 2: b"memories/v2/vectors\0" + tail}
        self._state: _State | None = None
        self._lock = threading.Lock()
        #: After a read: the narrowest encoding of its chunks, and whether some are wider than
        #: ``encoding`` (or the file is version 1): :func:`.rewrite.repack` then rewrites it.
        self.file_encoding = encoding
        self.needs_narrowing = False
        self._read_entries = 0  # entries the last read saw (with its chunk count: is it fragmented?)
        self._read_chunks = 0

    # -- format ------------------------------------------------------------------------------

    def _chunk_aad(self, number: int, version: int = 2) -> bytes:
        return self._aads[version] + b"chunk" + struct.pack(">Q", number)

    def _slot_aad(self, slot: int, version: int = 2) -> bytes:
        return self._aads[version] + b"commit" + bytes([slot])

    def _chunk(self, data: bytes, version: int) -> Chunk:
        try:
            chunk = parse_chunk(data, self.dims, version)
        except ChunkDamage as exc:
            raise _Damage(str(exc)) from exc
        self.file_encoding = narrowest(self.file_encoding, chunk.encoding)
        self._read_entries += len(chunk)
        self._read_chunks += 1
        if version == 1 or narrowest(chunk.encoding, self.encoding) != chunk.encoding:
            self.needs_narrowing = True
        return chunk

    def _decode_chunk(self, data: bytes, into: dict[str, np.ndarray], version: int = 2) -> None:
        chunk = self._chunk(data, version)
        for key, row in zip(chunk.keys, chunk.decoded(), strict=True):
            into[key] = row

    def _commit_bytes(self, state: _State) -> bytes:
        plain = _COMMIT.pack(state.generation, state.chunks, state.end, state.chain)
        blob = self._seal(plain, self._slot_aad(state.slot, state.version))
        if len(blob) + 2 > SLOT_SIZE:
            raise ValueError("the seal function's overhead does not fit a commit slot")
        return (struct.pack(">H", len(blob)) + blob).ljust(SLOT_SIZE, b"\0")

    def _read_commit(self, data: bytes, version: int) -> _State:
        best: _State | None = None
        for slot in (0, 1):
            start = len(MAGIC) + slot * SLOT_SIZE
            (n,) = struct.unpack_from(">H", data, start)
            if n == 0 or n > SLOT_SIZE - 2:
                continue
            try:
                plain = self._open(data[start + 2 : start + 2 + n], self._slot_aad(slot, version))
                gen, chunks, end, chain = _COMMIT.unpack(plain)
            except _NOT_DAMAGE:
                raise
            except Exception:
                continue  # a torn or foreign slot: the other one may still be good
            if best is None or gen > best.generation:
                best = _State(gen, chunks, end, chain, slot, version)
        if best is None:
            raise _Damage("no valid commit record (another vault or model, or damage)")
        return best

    def _version(self, head: bytes) -> int:
        magic = head[: len(MAGIC)]
        if len(head) < HEADER_SIZE or magic not in (MAGIC, MAGIC_V1):
            raise _Damage("not a vector sidecar of this version")
        self.file_encoding = self.encoding
        self.needs_narrowing = False
        self._read_entries = self._read_chunks = 0
        return 2 if magic == MAGIC else 1

    def _parse(self, data: bytes) -> tuple[_State, dict[str, np.ndarray]]:
        state = self._read_commit(data, self._version(data))
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
                plain = self._open(blob, self._chunk_aad(number, state.version))
            except _NOT_DAMAGE:
                raise
            except Exception as exc:
                raise _Damage(f"chunk {number} fails authentication") from exc
            chain = _chain(chain, blob)
            self._decode_chunk(plain, entries, state.version)
            pos += 4 + n
        if pos != state.end or chain != state.chain:
            raise _Damage("the chunks do not match the commit record")
        if len(data) > state.end:
            log.info("vector cache %s: dropping an uncommitted tail of %d bytes", self.path.name, len(data) - state.end)
        return state, entries

    def _frames(
        self, entries: Mapping[str, np.ndarray], first: int, chain: bytes, encoding: str, version: int = 2
    ) -> tuple[list[bytes], bytes]:
        items = [(k, self._vector(v)) for k, v in entries.items()]
        frames: list[bytes] = []
        for i in range(0, len(items), CHUNK_ENTRIES):
            part = items[i : i + CHUNK_ENTRIES]
            plain = encode_chunk([k for k, _ in part], np.stack([v for _, v in part]), encoding, version=version)
            blob = self._seal(plain, self._chunk_aad(first + len(frames), version))
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
        """:meth:`scan_chunks` with ``take(keys, rows)``: each chunk's keys and its float32 rows (a
        read-only view of float32 chunks; int8 and float16 rows decoded, with unit length)."""
        return self.scan_chunks(lambda c: take(c.keys, c.rows if c.encoding == "float32" else c.decoded()))

    def scan_chunks(self, take: Callable[[Chunk], None]) -> bool | None:
        """Every stored vector, a chunk at a time: ``take(chunk)`` per chunk in file order
        (:class:`~.chunks.Chunk`: its keys and its rows as stored, read-only views; a later
        duplicate key wins, as in :meth:`load`). The file is read a frame at a time, so memory
        holds one chunk, never the whole file or a float32 copy of every row.

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
                except _Damage as exc:  # anything else (no memory, a bug) propagates: nothing is discarded
                    log.warning("vector cache %s is damaged (%s); discarded, its vectors will be recomputed",
                                self.path.name, _damage_reason(exc))
                    self._discard()
                    return False
            self._state = state
            return True

    def _scan(self, f: BinaryIO, take: Callable[[Chunk], None]) -> _State:
        head = f.read(HEADER_SIZE)
        state = self._read_commit(head, self._version(head))
        size = os.fstat(f.fileno()).st_size
        if state.end > size:
            raise _Damage("the file is truncated")
        pos = HEADER_SIZE
        # The commit's hash chain is over every chunk's SHA-256: those of large chunks are computed
        # on another thread (hashlib releases the GIL) while this one decrypts and hands chunks
        # over; small ones here (handing each to a thread costs more than hashing it).
        hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memoriesd-vechash")
        digests: list[Future[bytes] | bytes] = []
        try:
            for number in range(state.chunks):
                pos = self._scan_chunk(f, take, number, pos, state, hashing, digests)
            chain = b""
            for d in digests:
                chain = hashlib.sha256(chain + (d if isinstance(d, bytes) else d.result())).digest()
        finally:
            hashing.shutdown(wait=True, cancel_futures=True)
        if pos != state.end or chain != state.chain:
            raise _Damage("the chunks do not match the commit record")
        if size > state.end:
            log.info("vector cache %s: dropping an uncommitted tail of %d bytes", self.path.name, size - state.end)
        return state

    def _scan_chunk(
        self, f: BinaryIO, take: Callable[[Chunk], None], number: int, pos: int, state: _State,
        hashing: ThreadPoolExecutor, digests: list[Future[bytes] | bytes],
    ) -> int:
        """Read, open and hand over chunk ``number`` at ``pos``; the position after it."""
        if pos + 4 > state.end:
            raise _Damage("the chunks end before the commit record says")
        frame = f.read(4)
        if len(frame) != 4:
            raise _Damage("the file is truncated")
        (n,) = _FRAME.unpack(frame)
        if pos + 4 + n > state.end:
            raise _Damage("a chunk runs past the committed end")
        blob = f.read(n)
        if len(blob) != n:
            raise _Damage("the file is truncated")
        digests.append(hashing.submit(_digest, blob) if n >= _THREAD_HASH_BYTES else _digest(blob))
        try:
            plain = self._open(blob, self._chunk_aad(number, state.version))
        except _NOT_DAMAGE:
            raise
        except Exception as exc:
            raise _Damage(f"chunk {number} fails authentication") from exc
        chunk = self._chunk(plain, state.version)
        try:
            take(chunk)
        except Exception as exc:
            raise _TakeFailed(exc) from exc
        return pos + 4 + int(n)

    def append(self, entries: Mapping[str, np.ndarray]) -> None:
        """Add entries durably (fsync) before returning; later duplicates win on load."""
        if not entries:
            return
        with self._lock:
            old: dict[str, np.ndarray] = {}
            if self._state is None:
                # Only damage means "start over": a read that fails (EACCES, EIO, EMFILE, no
                # memory) raises, and nothing is written over the vectors already sealed.
                try:
                    parsed = self._read_committed()
                except OSError as exc:
                    raise self._write_error(exc) from exc
                if parsed is not None:
                    self._state, old = parsed
            if self._state is not None and self._state.version == 1:
                if not old:
                    old = self._parse(self.path.read_bytes())[1]
                self._rewrite({**old, **entries}, narrowest(self.encoding, self.file_encoding))  # upgraded
                return
            if self._state is None:
                self._rewrite(entries, self.encoding)
                return
            state = self._state
            frames, chain = self._frames(entries, state.chunks, state.chain, self.encoding)
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
            self._rewrite(entries, self.encoding)

    @property
    def needs_repack(self) -> bool:
        """Whether the last full read found rows wider than :attr:`encoding` (a version-1 file, or
        rows written at another precision) or many small chunks (each embedding batch appends one:
        a 100,000-entry file of 32-entry chunks takes three times as long to load as one of full
        chunks)."""
        full = -(-self._read_entries // CHUNK_ENTRIES)
        return self.needs_narrowing or self._read_chunks > 2 * full + 64

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

    def _rewrite(self, entries: Mapping[str, np.ndarray], encoding: str, version: int = 2) -> None:
        """Replace the file. ``version`` 1 (float32 only) exists to test reading old files."""
        frames, chain = self._frames(entries, 0, b"", encoding, version)
        end = HEADER_SIZE + sum(len(f) for f in frames)
        state = _State(1, len(frames), end, chain, 0, version)
        body = (MAGIC if version == 2 else MAGIC_V1) + self._commit_bytes(state) + bytes(SLOT_SIZE) + b"".join(frames)
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
        except _Damage as exc:
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
