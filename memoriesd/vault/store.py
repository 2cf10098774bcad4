"""An unlocked vault: records in memory, durable sealed writes, compaction, re-wrap, key change.

A :class:`VaultStore` exists only while a vault is unlocked. Every write is a *batch*: its
entries are appended and fsynced, then the sealed head is replaced atomically; only then is the
batch applied in memory and acknowledged. Batches written together form a *group* whose last
entry is marked (:data:`~.format.GROUP_END`). On unlock, bytes after the head's length are never
just deleted: complete groups (a crash after the log fsync, or an older head.bin put back) are
rolled forward under a new head, and an incomplete group's bytes (or a log of a newer epoch than
the head's) are moved to a ``preserved-*`` file. When the disk fails a write after the point where its outcome is certain, the callers get
``io_error`` and the store refuses further writes until the vault is locked and unlocked.
A key change (:func:`.rekey.rekey`) stages every file under the new key as ``rekey-*``, then
switches by replacing ``header.json``; unlock finishes or removes an interrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bulk import bulk_load, thaw
from ..errors import BadPassphrase, DiskError, Internal, NotFound, UsageError, VaultCorrupt
from . import crypto, fsio
from .format import (
    GROUP_END,
    HEAD_NAME,
    HEADER_NAME,
    PRESERVED_PREFIX,
    DirSyncFailed,
    Head,
    Header,
    atomic_write,
    chain_start,
    decode_log,
    decode_tail,
    encode_entry,
    entry_plaintext,
    fsync_dir,
    log_name,
    next_hash,
    open_head,
    read_header,
    replace_file,
    seal_entry,
    seal_head,
)
from .keys import VaultKeys
from .keywrap import KdfParams, kdf_fields, new_header, unwrap_key, why, wrap_key
from .records import Record, now
from .recovery import (
    REKEY_HEAD,
    clean_leftovers,
    discard_rekey,
    finish_rekey,
    preserve_bytes,
    staged_files,
)

log = logging.getLogger("memoriesd.vault")



@dataclass(frozen=True)
class Setting:
    """A vault-level value kept in the log (policy, grants...)."""

    key: str
    value: Any  # None deletes


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
        # Set once the disk failed a write in a way that leaves its outcome unknown: every later
        # write is refused until the vault is locked and unlocked (which re-reads the files).
        self._failed: str | None = None

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def keys(self) -> VaultKeys:
        """Sealers and subkeys of this vault's key per purpose label (the key itself stays in ``vault/``)."""
        return VaultKeys(self.key)

    @property
    def usable(self) -> bool:
        """Open, and not refusing writes after a disk error."""
        return not self.closed and self._failed is None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, vault_dir: Path, vault_id: str, name: str, passphrase: bytes | bytearray, kdf: KdfParams) -> VaultStore:
        vault_dir.mkdir(mode=0o700)
        header = Header(
            vault_id=vault_id,
            name=name,
            created=now(),
            kdf=kdf_fields(kdf),
            wrap="",
        )
        key = crypto.new_key()
        wrap_key(header, passphrase, key)
        store = cls(vault_dir, header, key)
        fsio.write_new(vault_dir / log_name(0), b"")
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
        # Loading creates an object or more per record, all kept: no cyclic collection walks them
        # meanwhile or right after (see memoriesd.bulk).
        try:
            with bulk_load():
                store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _load(self) -> None:
        label = self.name
        try:
            self._settle_rekey()
        except OSError as exc:
            raise DiskError(
                f"vault {label} could not finish an interrupted key change: the disk reported an error "
                f"({why(exc)}); no data was removed: check the disk, then unlock the vault again"
            ) from exc
        try:
            blob = (self.dir / HEAD_NAME).read_bytes()
            head = open_head(self._head_sealer, self.vault_id, blob)
        except (OSError, ValueError, KeyError, TypeError, crypto.CryptoFailure) as exc:
            # Also what a header.json from before a key change (`vault passwd --rekey`) meets: its
            # key opens its own MAC, but the head (like everything else) is sealed under the new key.
            raise VaultCorrupt(
                f"vault {label} is damaged (its head is invalid, or header.json is older than the vault's "
                f"last key change): put back the current header.json, or restore the vault directory from a backup"
            ) from exc
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
        try:
            if len(data) > head.log_bytes:
                self._recover_tail(path, data)
            clean_leftovers(self.dir, self.vault_id, self.head.epoch)
        except OSError as exc:
            raise DiskError(
                f"vault {label} could not finish recovering an interrupted write: the disk reported an error "
                f"({why(exc)}); no data was removed: check the disk, then unlock the vault again"
            ) from exc

    def _settle_rekey(self) -> None:
        """A key change interrupted by a crash: finish it when it had switched (its staged head
        opens under the key this header wraps), else remove what it staged. Runs before the head
        is read, under unlock's gate."""
        if not staged_files(self.dir):
            return
        try:
            staged = open_head(self._head_sealer, self.vault_id, (self.dir / REKEY_HEAD).read_bytes())
        except (OSError, ValueError, KeyError, TypeError, crypto.CryptoFailure):
            discard_rekey(self.dir, self.vault_id)
            return
        finish_rekey(self.dir, self.vault_id, staged.epoch)
        log.warning("vault %s: finished a key change that a crash interrupted", self.vault_id)

    def _recover_tail(self, path: Path, data: bytes) -> None:
        """Bytes after the head: roll complete groups forward, move the rest to a preserved file.

        A complete group was fully written and fsynced before its head write (a crash in
        between), or it was acknowledged under a newer head than the one on disk (an older
        head.bin was put back): either way it is applied and a new head covers it. What follows
        the last complete group (a torn group, never acknowledged, or a log written before group
        markers existed) is copied, still sealed, to ``preserved-tail-<epoch>-<offset>.bin``
        before the log is cut back: nothing is ever deleted.
        """
        label = self.name
        groups, kept = decode_tail(self._records, self.vault_id, data, self.head)
        for group in groups:
            for entry in group.entries:
                try:
                    self._apply(entry)
                except (KeyError, ValueError, TypeError, AssertionError) as exc:
                    raise VaultCorrupt(f"vault {label} is damaged (a record is malformed): restore from a backup") from exc
        if kept < len(data):
            name = preserve_bytes(self.dir, f"{PRESERVED_PREFIX}tail-{self.head.epoch:08d}-{kept}.bin", data[kept:])
            log.warning(
                "vault %s: moved %d bytes of an incomplete or unmarked log write to %s (sealed, not loaded)",
                self.vault_id,
                len(data) - kept,
                name,
            )
        if groups:
            new_head = groups[-1].end
            self._write_head(new_head)
            log.warning(
                "vault %s: recovered %d log entries (%d complete writes) found after the head",
                self.vault_id,
                new_head.count - self.head.count,
                len(groups),
            )
            self.head = new_head
        if kept < len(data):
            fsio.truncate_file(path, kept)

    def close(self) -> None:
        """Forget the key and every record (lock)."""
        with self.lock:
            self.closed = True
            self._records.wipe()
            self._head_sealer.wipe()
            crypto.wipe(self.key)
            self.records.clear()
            self.settings.clear()
        thaw()  # the records were frozen by the unlock's bulk load (memoriesd.bulk)

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
            self._check_writable()
        except BaseException as exc:
            for b in group:
                b.finish(exc)
            return
        head = self.head
        revs: dict[str, int] = {}
        ok: list[_Batch] = []
        plain: list[tuple[dict[str, Any], bytes]] = []
        for b in group:
            problem = self._invalid(b.entries, revs)
            if problem is not None:
                b.finish(ValueError(problem))
                continue
            try:  # a batch that cannot be encoded (e.g. a lone surrogate) fails alone
                encoded = [(entry, entry_plaintext(entry)) for entry in b.entries]
            except Exception as exc:  # noqa: BLE001 - handed to its caller
                b.finish(UsageError("a record could not be encoded: its text is not valid Unicode") if isinstance(exc, UnicodeError) else exc)
                continue
            self._commit_revs(b.entries, revs)
            plain.extend(encoded)
            ok.append(b)
        if not ok:
            return
        # The group's last entry says "a head write covers everything up to here" (see _recover_tail).
        last = plain[-1][0]
        plain[-1] = (last, entry_plaintext({**last, GROUP_END: 1}))
        chunks: list[bytes] = []
        prev, seq = head.last_hash, head.count
        try:
            for _, plaintext in plain:
                framed = seal_entry(self._records, self.vault_id, head.epoch, seq, prev, plaintext)
                prev = next_hash(prev, framed[4:])
                chunks.append(framed)
                seq += 1
        except Exception as exc:  # noqa: BLE001 - handed to the callers (a key wiped by lock...)
            for b in ok:
                b.finish(exc)
            return
        data = b"".join(chunks)
        new_head = Head(head.epoch, seq, head.log_bytes + len(data), prev)
        failure = self._append(data, new_head)
        if failure is None:
            self._apply_group(ok, new_head, None)
        elif failure[0] == "durable":  # in the log, maybe under the new head: memory shows it
            self._apply_group(ok, new_head, failure[1])
        else:  # "unsaved" or "unknown": memory keeps what is certain, the state before the group
            for b in ok:
                b.finish(failure[1])

    def _append(self, data: bytes, new_head: Head) -> tuple[str, BaseException] | None:
        """Append a group and commit its head. None when all of it is durable; otherwise how far
        it got and the error for its callers:

        - ``unsaved``: the append did not complete and its bytes were cut back off (they cannot
          hold a complete group); the store stays usable;
        - ``unknown``: the log fsync failed, so whether the group is on disk is unknown (the log
          is left as it is: the next unlock rolls the group forward if it is complete there), or
          a failed append could not be cut back (nothing was saved, but the file is not trusted);
        - ``durable``: the log fsync succeeded, then the head write failed before or after its
          rename: the group is in the log and the next unlock rolls it forward if the new head is
          not there. The log is never cut under a head that may already cover it.

        In the last two cases the store refuses further writes until lock and unlock.
        """
        head = self.head
        path = self.dir / log_name(head.epoch)
        stage = "append"
        fd = -1
        try:
            fd = fsio.open_fd(path, os.O_WRONLY)
            fsio.pwrite_all(fd, data, head.log_bytes)
            stage = "fsync"
            fsio.fsync(fd)
            stage = "head"
            fsio.close(fd)
            fd = -1
            self._write_head(new_head)
            return None
        except BaseException as exc:
            if stage == "append":
                try:
                    if fd >= 0:
                        fsio.ftruncate(fd, head.log_bytes)
                        fsio.fsync(fd)
                except OSError as cut:
                    log.warning("vault %s: a failed append could not be cut back (%s)", self.vault_id, why(cut))
                    return "unknown", self._fail(exc, saved=False)
                if not isinstance(exc, OSError):
                    return "unsaved", exc
                return "unsaved", DiskError(
                    f"vault {self.name}: the write failed and nothing was saved: the disk reported an error "
                    f"({why(exc)}); check the disk (is it full?) and try again"
                )
            if stage == "fsync":
                return "unknown", self._fail(exc, saved=None)
            renamed = isinstance(exc, DirSyncFailed)
            log.warning(
                "vault %s: the head write failed %s its rename (%s); the fsynced log entries are kept",
                self.vault_id,
                "after" if renamed else "before",
                why(exc),
            )
            return "durable", self._fail(exc, saved=None)
        finally:
            if fd >= 0:
                try:
                    fsio.close(fd)
                except OSError:
                    pass

    def _fail(self, exc: BaseException, *, saved: bool | None) -> DiskError:
        """Enter the failed state after a disk error; the error for the write's callers."""
        self._failed = why(exc)
        outcome = "nothing was saved" if saved is False else "whether the write was saved is unknown"
        err = DiskError(
            f"vault {self.name}: the disk reported an error ({why(exc)}), so {outcome}: check the disk, "
            f"then lock and unlock the vault (it refuses writes until then)"
        )
        err.__cause__ = exc
        return err

    def _apply_group(self, ok: list[_Batch], new_head: Head, error: BaseException | None) -> None:
        """The group is in the log: make memory match it, and answer each caller."""
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
            b.finish(error)

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

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise DiskError(
                f"vault {self.name} refuses writes after a disk error ({self._failed}) left a write's outcome "
                f"unknown: check the disk, then lock and unlock the vault"
            )

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

    def revisions(self, record_id: str) -> tuple[Record, ...]:
        """Every revision kept of ``record_id``, oldest first, its tombstone last when deleted;
        empty when the vault holds no such id."""
        with self.lock:
            return tuple(self.records.get(record_id, ()))

    def revision_of(self, record_id: str, revision: int) -> Record | None:
        """Revision ``revision`` of a record, or None when it is not kept or is a tombstone (the
        latest is found first: what an index snapshot usually asks for)."""
        with self.lock:
            revs = self.records.get(record_id, ())
            for rec in reversed(revs):
                if rec.revision == revision:
                    return None if rec.deleted else rec
                if rec.revision < revision:
                    return None
            return None

    def current(self, record_ids: Iterable[str]) -> dict[str, Record]:
        """The latest revision of each of ``record_ids`` the vault holds and has not deleted."""
        with self.lock:
            return {rid: revs[-1] for rid in record_ids if (revs := self.records.get(rid)) and not revs[-1].deleted}

    def histories(self) -> dict[str, tuple[Record, ...]]:
        """Every record's kept revisions (deleted records too), as one consistent snapshot."""
        with self.lock:
            return {rid: tuple(revs) for rid, revs in self.records.items()}

    def knows(self, record_id: str) -> bool:
        """Whether the vault holds any revision of ``record_id`` (a tombstone counts)."""
        with self.lock:
            return record_id in self.records

    def setting_items(self, prefix: str) -> dict[str, Any]:
        """The settings whose key starts with ``prefix``, as one consistent snapshot."""
        with self.lock:
            return {k: v for k, v in self.settings.items() if k.startswith(prefix)}

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """A read-then-write step: no other thread commits between the reads made inside and the
        :meth:`commit` that ends it, so a write is made against the state it read (reentrant).
        Keep it short: every other reader and writer of the vault waits meanwhile."""
        with self.lock:
            yield

    # ------------------------------------------------------------------ maintenance

    def _log_entries(
        self, keep_revisions: int | None, setting: Callable[[str, Any], Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, list[Record]], dict[str, Any]]:
        """The entries of a whole new log (settings first, then each record's revisions, the last
        entry marked as the end of the group), the records and the settings it holds.

        ``keep_revisions``: compaction keeps that many revisions of each live record and drops
        deleted ones; None keeps every revision and every deletion (a rekey changes nothing that
        can be read). ``setting(key, value)`` may replace a setting's value as it is written.
        """
        settings = {k: (setting(k, v) if setting is not None else v) for k, v in self.settings.items()}
        entries: list[dict[str, Any]] = [{"t": "set", "key": k, "value": v} for k, v in settings.items()]
        new_records: dict[str, list[Record]] = {}
        for rid, revs in self.records.items():
            if keep_revisions is None:
                live = list(revs)
            elif revs[-1].deleted:
                continue
            else:
                live = [r for r in revs if not r.deleted][-keep_revisions:]
            new_records[rid] = live
            entries.extend(r.to_entry() for r in live)
        if entries:  # the whole new log is one group: its head covers all of it
            entries[-1] = {**entries[-1], GROUP_END: 1}
        return entries, new_records, settings

    def _write_log(self, path: Path, epoch: int, entries: list[dict[str, Any]], sealer: crypto.Sealer) -> Head:
        """Write a whole new log of ``epoch`` to ``path`` (created, never replaced), fsync it and the
        directory; the head that covers it. On any failure the file is removed again (best effort:
        else the next unlock deals with it) and the error raised."""
        prev = chain_start(self.vault_id, epoch)
        total = 0
        fd = fsio.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                buf = bytearray()
                for seq, entry in enumerate(entries):
                    framed = encode_entry(sealer, self.vault_id, epoch, seq, prev, entry)
                    prev = next_hash(prev, framed[4:])
                    buf += framed
                    total += len(framed)
                    if len(buf) >= 1 << 20:
                        fsio.write_all(fd, buf)
                        buf.clear()
                fsio.write_all(fd, buf)
                fsio.fsync(fd)
            finally:
                fsio.close(fd)
            fsync_dir(self.dir)
        except BaseException:
            try:
                fsio.unlink(path, missing_ok=True)
            except OSError:
                pass  # an unused copy: the next unlock keeps it aside or removes it
            raise
        return Head(epoch, len(entries), total, prev)

    def compact(self, keep_revisions: int) -> dict[str, int]:
        """Rewrite the log without deleted records and revisions beyond ``keep_revisions``."""
        with self.lock:
            self._check_writable()
            epoch = self.head.epoch + 1
            before = sum(len(r) for r in self.records.values())
            kept, new_records, _ = self._log_entries(keep_revisions)
            path = self.dir / log_name(epoch)
            old = self.dir / log_name(self.head.epoch)
            renamed = False  # set the moment the head naming the new log is in place
            new_head: Head | None = None
            try:
                new_head = self._write_log(path, epoch, kept, self._records)
                # The head's steps one by one (not atomic_write): whatever fails after the rename,
                # this code knows the new head is in place and must not remove the new log.
                replace_file(self.dir / HEAD_NAME, seal_head(self._head_sealer, self.vault_id, new_head))
                renamed = True
                fsync_dir(self.dir)
            except BaseException as exc:
                if renamed:
                    assert new_head is not None
                    # The head naming the new log is in place: the new log IS the vault now, and
                    # the old one stays too (the rename may not survive a power loss). The next
                    # unlock removes the old log if the head on disk names the new one, and keeps
                    # the new log as a preserved file if the old head came back.
                    self._compacted(new_head, new_records)
                    raise self._fail(exc, saved=None) from exc
                # The head was not replaced (this process knows it): the new log is an unused copy
                # of entries the old one holds, and this process created it.
                if new_head is not None:
                    try:
                        fsio.unlink(path, missing_ok=True)
                    except OSError:
                        pass  # the next unlock keeps it aside as a preserved-log file
                if isinstance(exc, OSError):
                    raise DiskError(
                        f"vault {self.name} was not compacted: the disk reported an error ({why(exc)}); "
                        f"nothing changed: check the disk and try again"
                    ) from exc
                raise
            self._compacted(new_head, new_records)
            try:
                fsio.unlink(old, missing_ok=True)
                fsync_dir(self.dir)
            except OSError as exc:
                # The compaction is durable (the head's directory fsync succeeded); the old log is
                # removed by the next unlock. The disk failed, though: take no more writes on trust.
                self._failed = why(exc)
                log.warning("vault %s: compacted, but the old log could not be removed (%s)", self.vault_id, why(exc))
            after = sum(len(r) for r in new_records.values())
            return {"revisions_before": before, "revisions_after": after, "log_bytes": new_head.log_bytes}

    def _compacted(self, new_head: Head, new_records: dict[str, list[Record]]) -> None:
        self.head = new_head
        self.records = new_records
        self.generation += 1

    def adopt_key(
        self, key: crypto.Secret, records: crypto.Sealer, head_sealer: crypto.Sealer, header: Header, head: Head, settings: dict[str, Any]
    ) -> None:
        """After a key change switched ``header.json``: use ``key`` from now on and wipe the old one.

        Caller holds ``self.lock`` (see :func:`.rekey.rekey`)."""
        old = (self._records, self._head_sealer, self.key)
        self.key, self._records, self._head_sealer = key, records, head_sealer
        self.header, self.head, self.settings = header, head, settings
        self.generation += 1
        old[0].wipe()
        old[1].wipe()
        crypto.wipe(old[2])

    def refuse_writes(self, reason: str) -> None:
        """Refuse every later write (a write's outcome is unknown) until the vault is unlocked again."""
        self._failed = reason

    def rewrap(self, new_passphrase: bytes | bytearray, kdf: KdfParams) -> None:
        """New passphrase: a new salt and wrapped key; no record is re-encrypted (the vault key
        stays: a copy of the old header still opens the vault with the old passphrase)."""
        with self.lock:
            self._check_writable()
            header = new_header(self.header, new_passphrase, self.key, kdf)
            try:
                atomic_write(self.dir / HEADER_NAME, header.to_bytes())
            except DirSyncFailed as exc:
                # The new header is in place but may not survive a power loss.
                self.header = header
                self._failed = why(exc)
                raise DiskError(
                    f"vault {self.name}: the new passphrase was written but the disk reported an error "
                    f"({why(exc)}), so after a crash the old passphrase may be the one that opens it: "
                    f"check the disk, then lock the vault and unlock it (try the new passphrase, then the old one)"
                ) from exc
            except OSError as exc:
                raise DiskError(
                    f"the passphrase of vault {self.name} was not changed: the disk reported an error "
                    f"({why(exc)}): check the disk and try again"
                ) from exc
            self.header = header


def public_header(vault_dir: Path) -> dict[str, Any] | None:
    """Vault id and name, readable while locked (names are not secret; see SECURITY.md)."""
    try:
        doc = json.loads((vault_dir / HEADER_NAME).read_text("utf-8"))
        return {"vault_id": str(doc["vault_id"]), "name": str(doc["name"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
