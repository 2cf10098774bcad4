"""An unlocked vault: records in memory, durable sealed writes, compaction, re-wrap.

A :class:`VaultStore` exists only while a vault is unlocked. Every write is a *batch*: its
entries are appended and fsynced, then the sealed head is replaced atomically; only then is the
batch applied in memory and acknowledged. A crash before the head commit leaves bytes after the
acknowledged length, which the next unlock drops (and logs).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import BadPassphrase, Internal, NotFound, UsageError, VaultCorrupt
from . import crypto
from .format import (
    HEAD_NAME,
    HEADER_NAME,
    Head,
    Header,
    atomic_write,
    b64d,
    b64e,
    chain_start,
    decode_log,
    encode_entry,
    fsync_dir,
    log_name,
    next_hash,
    open_head,
    read_header,
    seal_head,
)
from .records import Record, now

log = logging.getLogger("memoriesd.vault")


@dataclass(frozen=True)
class KdfParams:
    memory_kib: int = 65536
    iterations: int = 3
    lanes: int = 4


@dataclass(frozen=True)
class Setting:
    """A vault-level value kept in the log (policy, grants...)."""

    key: str
    value: Any  # None deletes


def _wrap_key(header: Header, passphrase: bytes | bytearray, vault_key: bytearray) -> None:
    salt = b64d(header.kdf["salt"])
    kek = crypto.derive_kek(
        passphrase, salt, memory_kib=header.kdf["memory_kib"], iterations=header.kdf["iterations"], lanes=header.kdf["lanes"]
    )
    try:
        header.wrap = b64e(crypto.seal(kek, bytes(vault_key), header.wrap_aad()))
    finally:
        crypto.wipe(kek)
    header.mac = header.compute_mac(vault_key)


def unwrap_key(header: Header, passphrase: bytes | bytearray) -> bytearray:
    """Vault key from the passphrase; ``bad_passphrase`` when it does not open."""
    salt = b64d(header.kdf["salt"])
    kek = crypto.derive_kek(
        passphrase, salt, memory_kib=header.kdf["memory_kib"], iterations=header.kdf["iterations"], lanes=header.kdf["lanes"]
    )
    try:
        key = bytearray(crypto.open_sealed(kek, b64d(header.wrap), header.wrap_aad()))
    except crypto.CryptoFailure as exc:
        raise BadPassphrase(
            f"wrong passphrase for vault {header.name}: try again (a lost passphrase cannot be recovered)"
        ) from exc
    finally:
        crypto.wipe(kek)
    if len(key) != crypto.KEY_BYTES:
        raise BadPassphrase(f"wrong passphrase for vault {header.name}: try again")
    return key


@dataclass
class _Batch:
    """One caller's entries, waiting in the group-commit queue until a writer finishes them."""

    entries: list[dict[str, Any]]
    done: bool = False
    error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self.done = True


class VaultStore:
    """The records of one unlocked vault. Thread-safe: every public method takes ``self.lock``."""

    def __init__(self, vault_dir: Path, header: Header, key: bytearray) -> None:
        self.dir = vault_dir
        self.header = header
        self.vault_id = header.vault_id
        if not isinstance(key, crypto.Secret):  # a Secret refuses use once wiped (lock)
            key, plain = crypto.Secret(key), key
            crypto.wipe(plain)
        self.key = key
        self.lock = threading.RLock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Batch] = []  # batches waiting for the next group write
        self._records = crypto.Sealer(key, crypto.LABEL_RECORDS)
        self._head_sealer = crypto.Sealer(key, crypto.LABEL_HEAD)
        self.records: dict[str, list[Record]] = {}
        self.settings: dict[str, Any] = {}
        self.generation = 0  # bumps on every change: caches compare it
        self.head = Head(0, 0, 0, chain_start(self.vault_id, 0))
        self.closed = False

    @property
    def name(self) -> str:
        return self.header.name

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, vault_dir: Path, vault_id: str, name: str, passphrase: bytes | bytearray, kdf: KdfParams) -> VaultStore:
        vault_dir.mkdir(mode=0o700)
        header = Header(
            vault_id=vault_id,
            name=name,
            created=now(),
            kdf={
                "alg": "argon2id",
                "memory_kib": kdf.memory_kib,
                "iterations": kdf.iterations,
                "lanes": kdf.lanes,
                "salt": b64e(crypto.random_bytes(crypto.SALT_BYTES)),
            },
            wrap="",
        )
        key = crypto.new_key()
        _wrap_key(header, passphrase, key)
        store = cls(vault_dir, header, key)
        fd = os.open(vault_dir / log_name(0), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fsync(fd)
        os.close(fd)
        store._write_head(store.head)
        atomic_write(vault_dir / HEADER_NAME, header.to_bytes())
        return store

    @classmethod
    def open(cls, vault_dir: Path, *, passphrase: bytes | bytearray | None = None, key: bytearray | None = None) -> VaultStore:
        header = read_header(vault_dir, vault_dir.name)
        if key is None:
            assert passphrase is not None
            key = unwrap_key(header, passphrase)
        elif len(key) != crypto.KEY_BYTES:
            raise BadPassphrase(f"the remembered key for vault {header.name} is invalid: unlock with the passphrase")
        label = header.name
        if not header.verify_mac(key):
            if passphrase is None:
                # A remembered key that does not fit this header: say so rather than "damaged".
                crypto.wipe(key)
                raise BadPassphrase(f"the remembered key for vault {label} does not open it: unlock with the passphrase")
            crypto.wipe(key)
            raise VaultCorrupt(f"vault {label} is damaged (its header was altered): restore the vault directory from a backup")
        store = cls(vault_dir, header, key)
        try:
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _load(self) -> None:
        label = self.name
        try:
            blob = (self.dir / HEAD_NAME).read_bytes()
            head = open_head(self._head_sealer, self.vault_id, blob)
        except (OSError, ValueError, KeyError, TypeError, crypto.CryptoFailure) as exc:
            raise VaultCorrupt(f"vault {label} is damaged (its head is invalid): restore the vault directory from a backup") from exc
        path = self.dir / log_name(head.epoch)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise VaultCorrupt(f"vault {label} is damaged (its log is missing): restore the vault directory from a backup") from exc
        entries = decode_log(self._records, self.vault_id, head.epoch, data, head, label)
        for entry in entries:
            try:
                self._apply(entry)
            except (KeyError, ValueError, TypeError, AssertionError) as exc:
                raise VaultCorrupt(f"vault {label} is damaged (a record is malformed): restore from a backup") from exc
        self.head = head
        if len(data) > head.log_bytes:
            log.warning("vault %s: dropped a torn or unacknowledged log tail of %d bytes", self.vault_id, len(data) - head.log_bytes)
            with open(path, "r+b") as f:
                f.truncate(head.log_bytes)
                os.fsync(f.fileno())
        # Leftovers of an interrupted compaction or atomic write.
        for p in self.dir.iterdir():
            stale = (p.name.startswith("log-") and p.name != path.name) or (p.name.startswith(".") and p.name.endswith(".tmp"))
            if stale:
                log.warning("vault %s: removed a leftover file from an interrupted write", self.vault_id)
                p.unlink(missing_ok=True)

    def close(self) -> None:
        """Forget the key and every record (lock)."""
        with self.lock:
            self.closed = True
            self._records.wipe()
            self._head_sealer.wipe()
            crypto.wipe(self.key)
            self.records.clear()
            self.settings.clear()

    # ------------------------------------------------------------------ state

    def _apply(self, entry: dict[str, Any]) -> None:
        t = entry["t"]
        if t == "set":
            key = str(entry["key"])
            if entry["value"] is None:
                self.settings.pop(key, None)
            else:
                self.settings[key] = entry["value"]
            return
        revs = self.records.get(str(entry["id"]))
        prev = revs[-1] if revs else None
        if t == "del" and prev is None:
            raise ValueError("delete of unknown record")
        rec = Record.from_entry(entry, prev)
        if prev is not None and rec.revision <= prev.revision:
            raise ValueError("revision order")
        self.records.setdefault(rec.id, []).append(rec)

    def _write_head(self, head: Head) -> None:
        atomic_write(self.dir / HEAD_NAME, seal_head(self._head_sealer, self.vault_id, head))

    def commit(self, ops: Iterable[Record | Setting]) -> None:
        """Append a batch durably, then apply it. All or nothing for this batch.

        Group commit: batches that arrive while another thread is writing wait in a queue, and
        the next thread to take the lock writes all of them with one fsync and one head
        replacement. Each caller returns only once its own batch is durable and applied (or
        raises what failed it). The writer's own batch goes first: a caller that holds
        ``self.lock`` while it reads and then commits (updates, deletes, grant use) keeps that
        read-then-write atomic, and the batches queued behind it (built without the lock) are
        checked against its result.
        """
        ops = list(ops)
        if not ops:
            return
        mine = _Batch([({"t": "set", "key": op.key, "value": op.value} if isinstance(op, Setting) else op.to_entry()) for op in ops])
        with self._queue_lock:
            self._queue.append(mine)
        with self.lock:
            if not mine.done:
                with self._queue_lock:
                    queued, self._queue = self._queue, []
                group = [mine] + [b for b in queued if b is not mine]
                try:
                    self._write_group(group)
                finally:
                    for b in group:  # nothing taken off the queue may stay unanswered
                        if not b.done:
                            b.finish(Internal("a vault write ended without an outcome: report this as a bug"))
        if not mine.done:  # pragma: no cover - every path above finishes it
            raise Internal("a vault write ended without an outcome: report this as a bug")
        if mine.error is not None:
            raise mine.error

    def _write_group(self, group: list[_Batch]) -> None:
        """Write batches as one durable append; each is finished with its own outcome. Caller holds ``self.lock``."""
        try:
            self._check_open()
        except BaseException as exc:
            for b in group:
                b.finish(exc)
            return
        head = self.head
        revs: dict[str, int] = {}
        ok: list[_Batch] = []
        chunks: list[bytes] = []
        prev = head.last_hash
        seq = head.count
        for b in group:
            problem = self._invalid(b.entries, revs)
            if problem is not None:
                b.finish(ValueError(problem))
                continue
            try:  # a batch that cannot be encoded (e.g. a lone surrogate) fails alone
                framed_batch = []
                b_prev, b_seq = prev, seq
                for entry in b.entries:
                    framed = encode_entry(self._records, self.vault_id, head.epoch, b_seq, b_prev, entry)
                    b_prev = next_hash(b_prev, framed[4:])
                    framed_batch.append(framed)
                    b_seq += 1
            except Exception as exc:  # noqa: BLE001 - handed to its caller
                b.finish(UsageError("a record could not be encoded: its text is not valid Unicode") if isinstance(exc, UnicodeError) else exc)
                continue
            self._commit_revs(b.entries, revs)
            chunks.extend(framed_batch)
            prev, seq = b_prev, b_seq
            ok.append(b)
        if not ok:
            return
        data = b"".join(chunks)
        path = self.dir / log_name(head.epoch)
        new_head = Head(head.epoch, seq, head.log_bytes + len(data), prev)
        try:
            with open(path, "r+b") as f:
                try:
                    f.seek(head.log_bytes)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                    self._write_head(new_head)
                except BaseException:
                    try:
                        f.truncate(head.log_bytes)
                    except OSError:
                        pass
                    raise
        except BaseException as exc:
            for b in ok:
                b.finish(exc)
            return
        self.head = new_head
        self.generation += 1
        for b in ok:
            try:
                for entry in b.entries:
                    self._apply(entry)
            except Exception:  # pragma: no cover - _invalid has checked every entry
                log.exception("vault %s: a durable batch could not be applied in memory", self.vault_id)
                b.finish(Internal("a record was written but not loaded: lock and unlock the vault, and report this as a bug"))
                continue
            b.finish(None)

    def _invalid(self, entries: list[dict[str, Any]], revs: dict[str, int]) -> str | None:
        """Why a batch could not be applied after the ones before it in ``revs`` (None: it can)."""
        seen: dict[str, int] = {}
        for entry in entries:
            if entry["t"] == "set":
                continue
            rid = str(entry["id"])
            last = seen.get(rid, revs.get(rid))
            if last is None:
                known = self.records.get(rid)
                last = known[-1].revision if known else None
            if entry["t"] == "del" and last is None:
                return "delete of unknown record"
            if last is not None and int(entry["rev"]) <= last:
                return "revision order"
            seen[rid] = int(entry["rev"])
        return None

    @staticmethod
    def _commit_revs(entries: list[dict[str, Any]], revs: dict[str, int]) -> None:
        """Record the revisions of a batch accepted into the group (for the batches after it)."""
        for entry in entries:
            if entry["t"] != "set":
                revs[str(entry["id"])] = int(entry["rev"])

    def _check_open(self) -> None:
        if self.closed:
            from ..errors import VaultLocked

            raise VaultLocked(f"vault {self.name} is locked: run `memories vault unlock {self.name}`")

    # ------------------------------------------------------------------ reads

    def get(self, record_id: str, revision: int | None = None) -> Record:
        with self.lock:
            self._check_open()
            revs = self.records.get(record_id)
            if not revs or (revision is None and revs[-1].deleted):
                raise NotFound(f"no record {record_id} in vault {self.name}: list them with `memories memory list`")
            if revision is None:
                return revs[-1]
            for rec in revs:
                if rec.revision == revision and not rec.deleted:
                    return rec
            raise NotFound(
                f"record {record_id} has no revision {revision} (it may have been compacted away): "
                f"see `memories memory history`"
            )

    def history(self, record_id: str) -> list[Record]:
        with self.lock:
            self._check_open()
            revs = self.records.get(record_id)
            if not revs or revs[-1].deleted:
                raise NotFound(f"no record {record_id} in vault {self.name}")
            return list(revs)

    def latest(self) -> list[Record]:
        with self.lock:
            self._check_open()
            return [revs[-1] for revs in self.records.values() if not revs[-1].deleted]

    # ------------------------------------------------------------------ maintenance

    def compact(self, keep_revisions: int) -> dict[str, int]:
        """Rewrite the log without deleted records and revisions beyond ``keep_revisions``."""
        with self.lock:
            self._check_open()
            epoch = self.head.epoch + 1
            kept: list[dict[str, Any]] = []
            for key, value in self.settings.items():
                kept.append({"t": "set", "key": key, "value": value})
            before = sum(len(r) for r in self.records.values())
            new_records: dict[str, list[Record]] = {}
            for rid, revs in self.records.items():
                if revs[-1].deleted:
                    continue
                live = [r for r in revs if not r.deleted][-keep_revisions:]
                new_records[rid] = live
                kept.extend(r.to_entry() for r in live)
            prev = chain_start(self.vault_id, epoch)
            path = self.dir / log_name(epoch)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            total = 0
            try:
                with os.fdopen(fd, "wb") as f:
                    for seq, entry in enumerate(kept):
                        framed = encode_entry(self._records, self.vault_id, epoch, seq, prev, entry)
                        prev = next_hash(prev, framed[4:])
                        f.write(framed)
                        total += len(framed)
                    f.flush()
                    os.fsync(f.fileno())
                fsync_dir(self.dir)
                new_head = Head(epoch, len(kept), total, prev)
                self._write_head(new_head)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            old = self.dir / log_name(self.head.epoch)
            self.head = new_head
            self.records = new_records
            old.unlink(missing_ok=True)
            fsync_dir(self.dir)
            self.generation += 1
            after = sum(len(r) for r in new_records.values())
            return {"revisions_before": before, "revisions_after": after, "log_bytes": total}

    def rewrap(self, new_passphrase: bytes | bytearray, kdf: KdfParams) -> None:
        """New passphrase: a new salt and wrapped key; no record is re-encrypted."""
        with self.lock:
            self._check_open()
            header = replace(self.header)
            header.kdf = {
                "alg": "argon2id",
                "memory_kib": kdf.memory_kib,
                "iterations": kdf.iterations,
                "lanes": kdf.lanes,
                "salt": b64e(crypto.random_bytes(crypto.SALT_BYTES)),
            }
            _wrap_key(header, new_passphrase, self.key)
            atomic_write(self.dir / HEADER_NAME, header.to_bytes())
            self.header = header


def public_header(vault_dir: Path) -> dict[str, Any] | None:
    """Vault id and name, readable while locked (names are not secret; see SECURITY.md)."""
    try:
        doc = json.loads((vault_dir / HEADER_NAME).read_text("utf-8"))
        return {"vault_id": str(doc["vault_id"]), "name": str(doc["name"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
