"""Sync in the vault's own process: when it runs, and what ``sync status`` shows.

A vault with targets syncs while it is unlocked: once at unlock, after each change (debounced:
``[sync] debounce_seconds`` of quiet, at most ten times that after the first change), when a folder
target changes (watchdog, as watched folders are), every ``[sync] poll_seconds`` otherwise, and on
``sync now``. One thread per synced vault runs the cycles (:class:`VaultSync`); it holds a
background lease while a cycle runs, so a lock cancels it at its next step and then ends it. With
nothing to do it sleeps on a condition: no CPU while idle.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import Cancelled, MemoriesError, NotFound, UsageError
from ..memory.forget import purge
from ..vault.live import LiveVault
from ..vault.store import Setting
from ..vault.versions import stamp_device
from .engine import CycleResult, DeviceForked, TargetSync
from .merge import open_conflicts
from .segments import Codec
from .stamps import DEVICE_RE, Clock, stamp_hlc
from .state import StateFile, SyncState, TargetState
from .transport import TargetError, Transport, parse_target

if TYPE_CHECKING:
    from ..rag.host import Host

log = logging.getLogger("memoriesd.sync")

#: The vault setting that keeps the device id deriving stamps of revisions older than sync.
ORIGIN_SETTING = "sync.origin"



class VaultSync:
    """Every target of one unlocked vault and the thread that syncs them."""

    def __init__(self, app: Host, vault: LiveVault, state: SyncState, state_file: StateFile) -> None:
        self.app = app
        self.vault = vault
        self.store = vault.store
        self.state = state
        self.file = state_file
        self.codec = Codec(vault.keys, vault.vault_id)
        self.clock = Clock(state.device, _highest_hlc(vault), state.origin)
        self._cond = threading.Condition()
        self._changed = 0.0  # first change not yet pushed (0: none)
        self._last_change = 0.0
        self._wake = False
        self._stop = False
        self._cycle_lock = threading.Lock()
        self._targets: dict[str, TargetSync] = {}
        self._watchers: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self.store.stamper = self.clock
        self.store.listeners.append(self._on_change)
        for tid in state.targets:
            self._open_target(tid)

    # ------------------------------------------------------------------ targets

    def _open_target(self, tid: str) -> TargetSync:
        ts = self.state.targets[tid]
        transport = self._transport(ts.target)
        sync = TargetSync(self.vault, self.state, tid, transport, self.codec, self.clock, self.save, self._purge)
        self._targets[tid] = sync
        self._watch(tid, transport)
        return sync

    def _transport(self, text: str) -> Transport:
        return parse_target(text, config=self.app.config)

    def _watch(self, tid: str, transport: Transport) -> None:
        """A folder target: pull when a file in it changes (inotify), not on a timer."""
        if transport.scheme != "folder" or not self.app.config.sync.watch or not os.path.isdir(transport.describe()):
            return
        from ..watch.watcher import FolderWatcher  # watchdog: only for vaults that sync to a folder

        try:
            watcher = FolderWatcher(transport.describe(), False, lambda _p: self.wake(), lambda _f: self.wake())
            watcher.start()
        except OSError as exc:
            log.warning("sync %s: the folder cannot be watched (%s): polled instead", tid, exc.strerror)
            return
        self._watchers[tid] = watcher

    def add(self, text: str) -> tuple[str, TargetState]:
        transport = self._transport(text)
        described = transport.describe()
        for tid, ts in self.state.targets.items():
            if ts.target == described:
                return tid, ts
        transport.ensure()
        tid = f"t{len(self.state.targets) + 1}"
        while tid in self.state.targets:
            tid += "x"
        self.state.targets[tid] = ts_new = TargetState(target=described, added=time.time())
        if self.state.origin and self.state.origin != self.state.device and self.state.origin not in ts_new.former:
            # This device synced before under another id (its sync state was lost or it forked): what
            # it wrote under that id is published again (devices that have it skip it).
            ts_new.former[self.state.origin] = ["", "~"]
        self.save()
        self._open_target(tid)
        self.start()
        self.wake()
        return tid, self.state.targets[tid]

    def remove(self, ref: str) -> TargetState:
        tid = self.resolve(ref)
        with self._cycle_lock:
            self._targets.pop(tid, None)
            watcher = self._watchers.pop(tid, None)
            if watcher is not None:
                watcher.stop()
            ts = self.state.targets.pop(tid)
            self.clock.mark_published(tid, None)
            self.save()
        return ts

    def resolve(self, ref: str | None) -> str:
        if ref is None:
            if len(self.state.targets) == 1:
                return next(iter(self.state.targets))
            raise UsageError("this vault syncs with several targets: name one (see `memories sync status`)")
        for tid, ts in self.state.targets.items():
            if ref in (tid, ts.target):
                return tid
        try:
            described = self._transport(ref).describe()
        except MemoriesError:
            described = ""
        for tid, ts in self.state.targets.items():
            if ts.target == described:
                return tid
        raise NotFound(f"vault {self.vault.name} does not sync with {ref}: see `memories sync status`")

    def save(self) -> None:
        self.file.save(self.state)

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"sync-{self.vault.vault_id}", daemon=True)
                self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def _on_change(self) -> None:
        with self._cond:
            now = time.monotonic()
            self._changed = self._changed or now
            self._last_change = now
            self._cond.notify_all()

    def _settings(self) -> tuple[float, float, float]:
        cfg = self.app.config.sync
        return cfg.debounce_seconds, cfg.poll_seconds, cfg.device_days

    def _run(self) -> None:
        debounce, poll, _days = self._settings()
        next_poll = 0.0  # a cycle at once: the unlock's
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    due = [next_poll]
                    if self._changed:
                        due.append(min(self._last_change + debounce, self._changed + 10 * debounce))
                    if self._wake or now >= min(due):
                        break
                    self._cond.wait(min(due) - now)
                if self._stop:
                    return
                self._wake = False
                self._changed = 0.0
            try:
                self.cycle()
            except Cancelled:
                return
            next_poll = time.monotonic() + (poll * 5 if self._watchers and len(self._watchers) == len(self._targets) else poll)

    def cycle(self, ref: str | None = None) -> dict[str, dict[str, Any]]:
        """Pull then push every target (or one); each target's error is kept in its state, not raised."""
        out: dict[str, dict[str, Any]] = {}
        with self._cycle_lock:
            tids = [self.resolve(ref)] if ref is not None else list(self._targets)
            for tid in tids:
                sync = self._targets.get(tid)
                if sync is None:
                    continue
                out[tid] = self._cycle_one(tid, sync)
        return out

    def _cycle_one(self, tid: str, sync: TargetSync) -> dict[str, Any]:
        ts = self.state.targets[tid]
        if self.store.settings.get("policy.device_only", False):
            ts.error = f"vault {self.vault.name} is device-only: it is not synced (`memories vault policy {self.vault.name} --device-only off` to sync it)"
            return {"error": ts.error}
        self.vault.acquire(touch=False)
        try:
            if ts.rekey:  # the key changed here: the target is written again under it first
                sync.rekey_target()
            for _ in range(2):
                try:
                    pulled = sync.pull()
                    pushed = sync.push()
                    break
                except DeviceForked:
                    self.clock = Clock(self.state.device, _highest_hlc(self.vault), self.state.origin)
                    self.store.stamper = self.clock
                    for other_id, other in self._targets.items():
                        other.clock = self.clock
                        self.clock.mark_published(other_id, self.state.targets[other_id].upto)
            else:  # pragma: no cover - a second fork in one cycle
                raise TargetError("this device's history forked twice in one sync: run `memories sync now` again")
            _days = self._settings()[2]
            if sync.forget_acked(_days):
                sync.compact()
            ts.error = ""
        except Cancelled:
            raise
        except MemoriesError as exc:
            ts.error = exc.message
            log.warning("sync %s: %s", tid, exc.message)
            self._quiet_save()
            return {"error": exc.message}
        except OSError as exc:
            ts.error = f"the target could not be used ({exc.strerror or type(exc).__name__}): check it, then run `memories sync now`"
            log.warning("sync %s: %s", tid, ts.error)
            self._quiet_save()
            return {"error": ts.error}
        finally:
            self.vault.release(touch=False)
        if pulled.changed and getattr(self.app, "rag", None) is not None:
            self.app.rag.background.request(self.vault.vault_id)
        return _result(pulled, pushed)

    def _quiet_save(self) -> None:
        try:
            self.save()
        except OSError:
            pass

    def _purge(self, ids: list[str], stamps: dict[str, str]) -> None:
        purge(self.app, self.vault, ids, stamps=stamps)

    def compact(self, ref: str | None, force: bool) -> dict[str, Any]:
        with self._cycle_lock:
            tid = self.resolve(ref)
            sync = self._targets[tid]
            if not force and not sync.forget_acked(self._settings()[2]):
                raise UsageError(
                    "not every device has applied this device's last forget yet (or there is none): "
                    "wait, or run `memories sync compact --force` (a device that did not apply it forgets it when it next syncs)"
                )
            self.vault.acquire(touch=False)
            try:
                return sync.compact()
            finally:
                self.vault.release(touch=False)

    def forget_device(self, ref: str | None, device: str) -> dict[str, Any]:
        with self._cycle_lock:
            tid = self.resolve(ref)
            ts = self.state.targets[tid]
            match = [d for d, p in ts.peers.items() if device in (d, p.label)]
            if not match:
                raise NotFound(f"no device {device} on this target: see `memories sync status`")
            for d in match:
                ts.peers.pop(d)
                self._targets[tid].transport.delete(self.codec.tip_name(d))
            self.save()
            return {"forgotten_devices": match}

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for watcher in self._watchers.values():
            watcher.stop()
        self._watchers.clear()
        if self.store.stamper is self.clock:
            self.store.stamper = None
        if self._on_change in self.store.listeners:
            self.store.listeners.remove(self._on_change)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.codec.wipe()
        self.file.wipe()

    # ------------------------------------------------------------------ status

    def conflicted(self) -> list[str]:
        """Ids of records with concurrent versions no later edit resolved (more than one head)."""
        out = []
        for rid, revs in self.store.histories().items():
            if rid in self.store.conflicts or any(r.version and len(r.parents) == 0 for r in revs[1:]) or _branches(revs):
                if open_conflicts(self.store, self.clock.origin, rid):
                    out.append(rid)
        return sorted(out)

    def summary(self) -> dict[str, Any]:
        """What `memories status` shows of sync: counts and times from the state alone (no walk of
        the records, unlike :meth:`status`), so the overview stays cheap."""
        targets = list(self.state.targets.values())
        pulls = [t.last_pull for t in targets]
        return {
            "targets": len(targets),
            "last_sync": min(pulls) if pulls and all(pulls) else None,
            "errors": sum(1 for t in targets if t.error),
            "problems": sum(len(t.problems) for t in targets),
        }

    def status(self) -> dict[str, Any]:
        me = self.state.device
        conflicted = self.conflicted()
        targets = []
        for tid, ts in self.state.targets.items():
            sync = self._targets.get(tid)
            pending = len(sync._unpublished()) if sync is not None else 0
            devices = [
                {"device": d, "label": p.label, "last_seen": p.seen or None, "applied": p.seq, "published": p.tip_seq}
                for d, p in sorted(ts.peers.items())
                if d != me
            ]
            targets.append(
                {
                    "id": tid,
                    "target": ts.target,
                    "epoch": ts.epoch,
                    "last_push": ts.last_push or None,
                    "last_pull": ts.last_pull or None,
                    "pending": pending,
                    "published": ts.seq,
                    "pushed": ts.pushed,
                    "received": ts.received,
                    "devices": devices,
                    "problems": sorted(ts.problems.values()),
                    "error": ts.error or None,
                    "activity": sync.activity if sync is not None else "idle",
                }
            )
        return {"device": me, "label": self.state.label or socket.gethostname()[:64], "targets": targets, "conflicts": sorted(conflicted)}


def _branches(revs: tuple[Any, ...]) -> bool:
    """Whether a record's revisions are not one straight line (cheap test before the exact one)."""
    prev = ""
    for rec in revs:
        if rec.version:
            if prev and prev not in rec.parents:
                return True
            prev = rec.version
        else:
            prev = ""
    return False


def _highest_hlc(vault: LiveVault) -> int:
    top = 0
    for revs in vault.store.histories().values():
        for rec in revs:
            if rec.version:
                top = max(top, stamp_hlc(rec.version))
    for recs in vault.store.conflicts.values():
        for rec in recs:
            if rec.version:
                top = max(top, stamp_hlc(rec.version))
    return top


def _result(pulled: CycleResult, pushed: CycleResult) -> dict[str, Any]:
    return {
        "received": pulled.received,
        "applied": pulled.applied,
        "already_had": pulled.duplicates,
        "changed": len(pulled.changed),
        "conflicts": len(pulled.conflicts),
        "forgotten": len(pulled.forgotten),
        "pushed": pushed.pushed,
        "segments": pushed.segments,
        "header_adopted": pulled.header_adopted,
    }


class SyncService:
    """Sync for every unlocked vault of this process that has targets (see the module docstring)."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._vaults: dict[str, VaultSync] = {}
        app.vaults.on_unlock(self._on_unlock)
        app.vaults.on_lock(self._on_lock)

    def _state_file(self, vault: LiveVault) -> StateFile:
        return StateFile(vault.store.dir, vault.vault_id, vault.keys)

    def _on_unlock(self, vault_id: str) -> None:
        vault = self.app.vaults.live(vault_id)
        if vault is None:
            return
        sf = self._state_file(vault)
        state = sf.load()
        if state is None or not state.targets:
            sf.wipe()
            return
        self._begin(vault, state, sf)

    def _begin(self, vault: LiveVault, state: SyncState, sf: StateFile) -> VaultSync:
        # The id that derives the stamps of revisions older than sync is kept in the vault's log too
        # (settings stay on this device): a lost sync-state.bin must not give those revisions new
        # stamps (every other device would see them as concurrent copies).
        kept = vault.store.settings.get(ORIGIN_SETTING)
        if isinstance(kept, str) and DEVICE_RE.match(kept):
            state.origin = kept
        else:
            state.origin = state.origin or state.device
            vault.store.commit([Setting(ORIGIN_SETTING, state.origin)])
        vs = VaultSync(self.app, vault, state, sf)
        with self._lock:
            self._vaults[vault.vault_id] = vs
        vs.start()
        return vs

    def _on_lock(self, vault_id: str) -> None:
        with self._lock:
            vs = self._vaults.pop(vault_id, None)
        if vs is not None:
            vs.close()

    def of(self, vault: LiveVault, *, create: bool = False) -> VaultSync | None:
        with self._lock:
            vs = self._vaults.get(vault.vault_id)
        if vs is not None or not create:
            return vs
        sf = self._state_file(vault)
        state = sf.load() or SyncState()
        return self._begin(vault, state, sf)

    def close(self) -> None:
        with self._lock:
            items = list(self._vaults.values())
            self._vaults.clear()
        for vs in items:
            vs.close()


__all__ = ["SyncService", "VaultSync", "stamp_device"]
