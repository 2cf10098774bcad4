"""Writing a vault's log: group commit (append, fsync, then the head) and compaction (a whole new log).

:class:`LogWriter` is the base of :class:`~.store.VaultStore` that holds these writes; the store
adds opening, recovery on unlock, the reads, re-wrap and the key's lifetime. Batches written
together form a *group* whose last entry is marked (:data:`~.format.GROUP_END`): a head write
covers everything up to it. When the disk fails a write after the point where its outcome is
certain, the callers get ``io_error`` and the store refuses further writes until the vault is
locked and unlocked.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DiskError, Internal, UsageError
from . import crypto, fsio
from .format import (
    GROUP_END,
    HEAD_NAME,
    DirSyncFailed,
    Head,
    Header,
    atomic_write,
    chain_start,
    encode_entry,
    entry_plaintext,
    fsync_dir,
    log_name,
    next_hash,
    replace_file,
    seal_entry,
    seal_head,
)
from .keywrap import why
from .records import Record
from .versions import FORGOT_PREFIX, Stamper, dropped_heads, heads, resolved_kept, spliced, versions

log = logging.getLogger("memoriesd.vault")


@dataclass(frozen=True)
class Setting:
    """A vault-level value kept in the log (policy, grants...)."""

    key: str
    value: object  # None deletes


@dataclass
class _Batch:
    """One caller's entries, waiting in the group-commit queue until a writer finishes them."""

    entries: list[dict[str, Any]]
    done: bool = False
    error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self.done = True


class LogWriter:
    """The log writes of a :class:`~.store.VaultStore` (which sets every attribute declared here).
    Thread-safe as the store is: every public method takes ``self.lock``."""

    dir: Path
    header: Header
    vault_id: str
    lock: threading.RLock
    _queue_lock: threading.Lock
    _queue: list[_Batch]  # batches waiting for the next group write
    _records: crypto.Sealer
    _head_sealer: crypto.Sealer
    records: dict[str, list[Record]]
    conflicts: dict[str, list[Record]]  # conflict revisions per record (sync): kept, never current
    stamper: Stamper | None  # set while the vault syncs: every new revision gets a stamp and parents
    listeners: list[Callable[[], None]]  # called after each durable group (sync's debounced push)
    settings: dict[str, Any]
    generation: int  # bumps on every change: caches compare it
    head: Head
    closed: bool
    _failed: str | None  # set once the disk failed a write in a way that leaves its outcome unknown

    @property
    def name(self) -> str:
        return self.header.name

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
        if entry.get("c"):  # a conflict revision (sync): kept beside the revisions, never current
            if prev is None:
                raise ValueError("conflict revision of an unknown record")
            self.conflicts.setdefault(prev.id, []).append(Record.from_entry(entry, prev))
            return
        if t == "del" and prev is None and "v" not in entry:
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
        for listener in list(self.listeners):
            listener()

    def _write_group(self, group: list[_Batch]) -> None:
        """Write batches as one durable append; each is finished with its own outcome. Caller holds ``self.lock``."""
        try:
            self._check_writable()
        except BaseException as exc:
            for b in group:
                b.finish(exc)
            return
        if self.stamper is not None:
            self._stamp(group)
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

    def _stamp(self, group: list[_Batch]) -> None:
        """Give each new revision of the group a stamp and its parents (the record's heads, or the
        group's own previous revision of it). Entries that carry a stamp (sync's) keep it."""
        stamper = self.stamper
        assert stamper is not None
        latest: dict[str, str] = {}
        for b in group:
            for entry in b.entries:
                if entry["t"] == "set" or entry.get("c"):
                    continue
                rid = str(entry["id"])
                if "v" in entry:
                    latest[rid] = str(entry["v"])
                    continue
                if rid in latest:
                    parents = [latest[rid]]
                else:
                    parents = heads(versions(self.records.get(rid, ()), self.conflicts.get(rid, ()), stamper.origin))
                entry["v"] = latest[rid] = stamper.next()
                entry["p"] = parents

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
            if entry.get("c"):
                rid = str(entry["id"])
                if rid not in self.records and rid not in revs and rid not in seen:
                    return "conflict revision of an unknown record"
                continue
            rid = str(entry["id"])
            last = seen.get(rid, revs.get(rid))
            if last is None:
                known = self.records.get(rid)
                last = known[-1].revision if known else None
            if entry["t"] == "del" and last is None and "v" not in entry:
                return "delete of unknown record"
            if last is not None and int(entry["rev"]) <= last:
                return "revision order"
            seen[rid] = int(entry["rev"])
        return None

    @staticmethod
    def _commit_revs(entries: list[dict[str, Any]], revs: dict[str, int]) -> None:
        """Record the revisions of a batch accepted into the group (for the batches after it)."""
        for entry in entries:
            if entry["t"] != "set" and not entry.get("c"):
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

    def _log_entries(
        self, keep_revisions: int | None, setting: Callable[[str, Any], Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, list[Record]], dict[str, Any], dict[str, list[Record]]]:
        """The entries of a whole new log (settings first, then each record's revisions, the last
        entry marked as the end of the group), the records and the settings it holds.

        ``keep_revisions``: compaction keeps that many revisions of each live record and drops
        deleted ones; None keeps every revision and every deletion (a rekey changes nothing that
        can be read). ``setting(key, value)`` may replace a setting's value as it is written.
        """
        settings = {k: (setting(k, v) if setting is not None else v) for k, v in self.settings.items()}
        entries: list[dict[str, Any]] = [{"t": "set", "key": k, "value": v} for k, v in settings.items()]
        new_records: dict[str, list[Record]] = {}
        new_conflicts: dict[str, list[Record]] = {}
        for rid, revs in self.records.items():
            if keep_revisions is None:
                live = list(revs)
            elif revs[-1].deleted and revs[-1].version and FORGOT_PREFIX + rid not in self.settings:
                # A synced vault keeps a deleted record's tombstone (no text): a device that edited it
                # meanwhile must meet the deletion, not bring the record back (memoriesd.sync.merge).
                live = [revs[-1]]
            elif revs[-1].deleted:
                continue
            else:  # a synced record's deletion that another device's edit named (it brought the record back) is a version every device holds: kept
                live = [r for r in revs if not r.deleted or r.version][-keep_revisions:]
            extra = list(self.conflicts.get(rid, ()))
            if revs[-1].version and keep_revisions is not None:
                stamper = self.stamper
                origin = stamper.origin if stamper is not None else ""
                own = {stamper.device, origin} if stamper is not None else set()
                published = stamper.published_upto if stamper is not None else ""
                extra = resolved_kept(revs, live, extra, origin) + dropped_heads(revs, live, extra, origin)
                live, extra = spliced(revs, self.conflicts.get(rid, ()), live, extra, origin, own, published)
            new_records[rid] = live
            entries.extend(_alone(r) if r.deleted and i == 0 else r.to_entry() for i, r in enumerate(live))
            if extra:  # conflict revisions follow their record's revisions
                new_conflicts[rid] = extra
                entries.extend(r.to_entry() for r in extra)
        if entries:  # the whole new log is one group: its head covers all of it
            entries[-1] = {**entries[-1], GROUP_END: 1}
        return entries, new_records, settings, new_conflicts

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
            kept, new_records, _, new_conflicts = self._log_entries(keep_revisions)
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
                    self._compacted(new_head, new_records, new_conflicts)
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
            self._compacted(new_head, new_records, new_conflicts)
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

    def _compacted(self, new_head: Head, new_records: dict[str, list[Record]], new_conflicts: dict[str, list[Record]]) -> None:
        self.head = new_head
        self.records = new_records
        self.conflicts = new_conflicts
        self.generation += 1


def _alone(tomb: Record) -> dict[str, Any]:
    """A tombstone written without the revisions before it: it names its kind itself."""
    return {**tomb.to_entry(), "kind": tomb.kind}
