"""An unlocked vault: records in memory, durable sealed writes, compaction, re-wrap, key change.

A :class:`VaultStore` exists only while a vault is unlocked. Every write (:mod:`.logwrite`) is a *batch*: its
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
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..bulk import bulk_load, thaw
from ..errors import BadPassphrase, DiskError, NotFound, VaultCorrupt
from . import crypto, fsio
from .format import (
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
    log_name,
    open_head,
    read_header,
)
from .keys import VaultKeys
from .keywrap import KdfParams, kdf_fields, new_header, unwrap_key, why, wrap_key
from .logwrite import LogWriter, _Batch
from .logwrite import Setting as Setting  # re-exported: callers import it from here
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


class VaultStore(LogWriter):
    """The records of one unlocked vault. Thread-safe: every public method takes ``self.lock``.
    Its log writes (group commit, compaction) are in :class:`~.logwrite.LogWriter`."""

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
        self.conflicts: dict[str, list[Record]] = {}
        self.stamper = None
        self.listeners = []
        self.settings: dict[str, Any] = {}
        self.generation = 0  # bumps on every change: caches compare it
        self.head = Head(0, 0, 0, chain_start(self.vault_id, 0))
        self.closed = False
        # Set once the disk failed a write in a way that leaves its outcome unknown: every later
        # write is refused until the vault is locked and unlocked (which re-reads the files).
        self._failed: str | None = None

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
    def join(
        cls, vault_dir: Path, shared: Header, passphrase: bytes | bytearray, name_of: Callable[[VaultKeys], str]
    ) -> VaultStore:
        """A vault made on this device from a sync target's copy of its header (``shared``, name "").

        The key is unwrapped with the passphrase and the copy's MAC checked under it; ``name_of``
        gives the local name (the target's sealed name, or the user's). The log starts empty: sync
        fills it. The header here wraps the same key under the same passphrase, with a MAC over the
        local name."""
        key = unwrap_key(shared, passphrase)
        if not shared.verify_mac(key):
            crypto.wipe(key)
            raise VaultCorrupt("the sync target's header was altered: join from a target you trust, or restore its memories-sync.json")
        try:
            name = name_of(VaultKeys(key))
        except BaseException:
            crypto.wipe(key)
            raise
        header = Header(vault_id=shared.vault_id, name=name, created=shared.created, kdf=dict(shared.kdf), wrap=shared.wrap)
        header.mac = header.compute_mac(key)
        vault_dir.mkdir(mode=0o700)
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
            self.conflicts.clear()
            self.listeners.clear()
            self.settings.clear()
        thaw()  # the records were frozen by the unlock's bulk load (memoriesd.bulk)

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

    def shared_header(self) -> Header:
        """The header as a sync target keeps it: no name (the target seals it apart), a MAC under this key."""
        with self.lock:
            self._check_open()
            out = replace(self.header, name="")
            out.mac = out.compute_mac(self.key)
            return out

    def shares_key(self, shared: Header) -> bool:
        """Whether ``shared`` (a sync target's header copy) is authentic under this vault's key."""
        with self.lock:
            self._check_open()
            return shared.vault_id == self.vault_id and shared.verify_mac(self.key)

    def adopt_wrap(self, shared: Header) -> bool:
        """A passphrase change made on another device: take its KDF parameters and wrapped key when
        ``shared`` (a target's header copy) is authentic under this vault's key. True when the local
        header changed; ValueError when ``shared`` is not this key's (a key change elsewhere, or forged)."""
        with self.lock:
            self._check_writable()
            if shared.vault_id != self.vault_id or not shared.verify_mac(self.key):
                raise ValueError("not this vault key's header")
            if shared.kdf == self.header.kdf and shared.wrap == self.header.wrap:
                return False
            header = replace(self.header, kdf=dict(shared.kdf), wrap=shared.wrap)
            header.mac = header.compute_mac(self.key)
            atomic_write(self.dir / HEADER_NAME, header.to_bytes())
            self.header = header
            return True

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
