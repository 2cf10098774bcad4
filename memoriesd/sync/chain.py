"""The plumbing every sync cycle shares (:class:`ChainBase`): this device's chain on a target (its
segments, its tip, the target's header), merging what arrives, and what a new epoch's base holds.

:class:`~memoriesd.sync.epochs.Epochs` adds compaction and key changes on top of it, and
:class:`~memoriesd.sync.engine.TargetSync` (the class the service uses) the pull and the push.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import MemoriesError
from ..memory.forget import FORGOT_PREFIX
from ..vault.live import LiveVault
from ..vault.versions import stamp_device, versions
from .merge import plan, to_wire
from .segments import (
    HEADER_FILE,
    SEGMENT,
    TIP,
    Codec,
    Opened,
    digest,
    read_target_header,
    target_header_bytes,
)
from .stamps import Clock
from .state import SyncState, TargetState
from .transport import Transport

log = logging.getLogger("memoriesd.sync")

#: Entries committed per log write while a pull applies many versions (a join).
COMMIT_BATCH = 2000


@dataclass
class CycleResult:
    """What one pull or push did (for status, notices and tests)."""

    received: int = 0
    applied: int = 0
    duplicates: int = 0  # versions received that this device already had
    conflicts: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)
    forgotten: list[str] = field(default_factory=list)
    pushed: int = 0
    segments: int = 0
    header_adopted: bool = False


Purge = Callable[[list[str], dict[str, str]], None]



class ChainBase:
    """One (vault, target): its state, codec, transport and this device's chain. Not thread-safe."""


    def __init__(
        self, vault: LiveVault, state: SyncState, target_id: str, transport: Transport, codec: Codec, clock: Clock,
        save: Callable[[], None], purge: Purge,
    ) -> None:
        self.vault = vault
        self.store = vault.store
        self.state = state
        self.tid = target_id
        self.transport = transport
        self.codec = codec
        self.clock = clock
        self._save = save
        self._purge = purge
        self._unreadable: dict[str, float] = {}  # name -> first time it did not open (this process)
        self._inbox: dict[str, dict[int, tuple[str, Opened]]] = {}  # device -> seq -> (name, opened), not yet applied
        self._markers: dict[str, Opened] = {}
        self._ahead: dict[str, Opened] = {}  # segments of an epoch no marker announced (yet)
        self.activity = "idle"  # what the cycle is doing now, for `sync status` (no content)
        clock.mark_published(target_id, state.targets[target_id].upto)

    @property
    def ts(self) -> TargetState:
        return self.state.targets[self.tid]

    @property
    def device(self) -> str:
        return self.state.device

    def _problem(self, kind: str, text: str) -> None:
        if self.ts.problems.get(kind) != text:
            log.warning("sync %s: %s", self.tid, text)
        self.ts.problems[kind] = text

    def _merge(self, ready: list[dict[str, Any]], out: CycleResult) -> None:
        forgets: dict[str, str] = {}
        puts: list[dict[str, Any]] = []
        for v in ready:
            self.clock.observe(v["v"])
            if v.get("f"):
                forgets.setdefault(v["id"], v["v"])
            else:
                puts.append(v)
        forgotten = {k[len(FORGOT_PREFIX) :] for k in self.store.setting_items(FORGOT_PREFIX)} | set(forgets)
        for start in range(0, len(puts), COMMIT_BATCH):
            self.activity = f"applying {min(start + COMMIT_BATCH, len(puts)):,} of {len(puts):,} versions"
            self.vault.check()
            with self.store.exclusive():
                p = plan(self.store, self.clock.origin, puts[start : start + COMMIT_BATCH], forgotten)
                self.store.commit(p.records)
            out.applied += p.applied
            out.duplicates += p.duplicates
            out.conflicts |= p.conflicts
            out.changed |= p.changed
        out.received += len(ready)
        self.ts.received += len(ready)
        new = {rid: s for rid, s in forgets.items() if FORGOT_PREFIX + rid not in self.store.settings}
        if new:
            self._purge(list(new), new)
            out.forgotten.extend(new)

    def _unpublished(self) -> list[dict[str, Any]]:
        """This device's versions above the published stamp, oldest first, and its forgets."""
        ts, me = self.ts, self.device

        def mine(stamp: str) -> bool:
            if stamp_device(stamp) == me:
                return stamp > ts.upto
            lo_hi = ts.former.get(stamp_device(stamp))  # written under an id this device had before a fork
            return lo_hi is not None and lo_hi[0] < stamp <= lo_hi[1]

        out: list[tuple[str, dict[str, Any]]] = []
        for rid, revs in self.store.histories().items():
            conflicts = self.store.conflicts.get(rid, ())
            for stamp, ver in versions(revs, conflicts, self.clock.origin).items():
                if mine(stamp):
                    out.append((stamp, to_wire(ver.record, stamp, ver.parents)))
        for key, stamp in self.store.setting_items(FORGOT_PREFIX).items():
            if isinstance(stamp, str) and mine(stamp):
                rid = key[len(FORGOT_PREFIX) :]
                out.append((stamp, {"t": "del", "id": rid, "v": stamp, "p": [], "f": 1, "updated": time.time()}))
        out.sort(key=lambda x: x[0])
        return [v for _, v in out]

    def _write_segment(self, chunk: list[dict[str, Any]], out: CycleResult, *, base: bool = False, save: bool = True) -> str:
        ts = self.ts
        seq = ts.seq + 1
        doc = {"device": self.device, "epoch": ts.epoch, "seq": seq, "prev": ts.hash, "time": time.time(), "versions": chunk}
        if base:
            doc["base"] = True
        data = self.codec.seal(SEGMENT, doc)
        name = self.codec.segment_name(self.device, ts.epoch, seq)
        self.vault.check()
        self.transport.write(name, data)
        mine = [v["v"] for v in chunk if stamp_device(v["v"]) == self.device]
        ts.seq, ts.hash = seq, digest(data)
        if mine:
            ts.upto = max(ts.upto, *mine)
        ts.own.append([seq, ts.upto])
        self.clock.mark_published(self.tid, ts.upto)
        if any(v.get("f") for v in chunk):
            ts.forget_seq = seq
        ts.files[name] = [SEGMENT, self.device, ts.epoch, seq, ts.hash]
        ts.pushed += len(chunk)
        out.pushed += len(chunk)
        out.segments += 1
        if save:
            self._save()  # a crash after this write and before the save is adopted by the next pull
        return name

    def _tip_stale(self) -> bool:
        ts = self.ts
        acks = {d: p.seq for d, p in ts.peers.items() if d != self.device}
        return self._last_tip != (ts.epoch, ts.seq, acks) or time.time() - self._tip_time > 3600

    _last_tip: tuple[int, int, dict[str, int]] | None = None
    _tip_time = 0.0

    def _write_tip(self) -> None:
        ts = self.ts
        acks = {d: p.seq for d, p in ts.peers.items() if d != self.device}
        label = self.state.label or socket.gethostname()[:64]
        doc = {"device": self.device, "epoch": ts.epoch, "seq": ts.seq, "hash": ts.hash, "acks": acks, "time": time.time(), "label": label}
        self.transport.write(self.codec.tip_name(self.device), self.codec.seal(TIP, doc))
        self._last_tip, self._tip_time = (ts.epoch, ts.seq, acks), time.time()

    def _write_header_if_needed(self) -> None:
        self._write_header(force=False)

    def _write_header(self, *, force: bool) -> None:
        """The target's header: written when missing, when this device's passphrase changed (its
        wrap differs), and after a key change here (``force``)."""
        shared = self.store.shared_header()
        if not force:
            data = self.transport.read(HEADER_FILE)
            if data is not None and self.ts.header_wrap in ("", shared.wrap):
                # The passphrase did not change here: never overwrite the target's header (another
                # device's newer passphrase there is followed by pull, not undone).
                self.ts.header_wrap = shared.wrap
                return
            if data is not None:
                try:
                    th = read_target_header(data)
                except ValueError:
                    raise TargetRefused("the target's memories-sync.json is damaged: restore it, or remove the target and add it again") from None
                if th.header.vault_id != self.store.vault_id:
                    raise TargetRefused("the target holds another vault: choose an empty folder or path for this vault")
                if th.header.kdf == shared.kdf and th.header.wrap == shared.wrap:
                    return
        wrapped = time.time()
        meta = json.dumps({"name": self.store.name, "wrapped": wrapped})
        self.transport.write(HEADER_FILE, target_header_bytes(shared, self.codec.seal_name(meta)))
        self.ts.wrap_time = wrapped
        self.ts.header_wrap = shared.wrap

    def _heads(self) -> list[dict[str, Any]]:
        """Every record's heads for a new epoch's base, each naming *all* its ancestors this device
        knows as parents: a device that holds an older version (made or received before the epoch)
        then sees it superseded, though the versions between are not in the base."""
        from ..vault.versions import heads

        out: list[dict[str, Any]] = []
        for rid, revs in self.store.histories().items():
            known = versions(revs, self.store.conflicts.get(rid, ()), self.clock.origin)
            for stamp in heads(known):
                ver = known[stamp]
                out.append(to_wire(ver.record, stamp, sorted(_ancestors(known, stamp))))
        for key, stamp in self.store.setting_items(FORGOT_PREFIX).items():
            out.append({"t": "del", "id": key[len(FORGOT_PREFIX) :], "v": stamp, "p": [], "f": 1, "updated": 0.0})
        return out

    def pull(self) -> CycleResult:  # pragma: no cover - TargetSync's
        raise NotImplementedError

    def _take(self, name: str, opened: Opened) -> None:  # pragma: no cover - TargetSync's
        raise NotImplementedError


def _ancestors(known: dict[str, Any], stamp: str) -> set[str]:
    """Every stamp ``stamp`` descends from, as far as ``known`` (stamp -> Version) tells."""
    out: set[str] = set()
    todo = list(known[stamp].parents)
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            if p in known:
                todo.extend(known[p].parents)
    return out


class TargetRefused(MemoriesError):
    """The target holds something this device must not build on (another vault, a key changed elsewhere)."""

    code = "sync_refused"
    exit_code = 1


class DeviceForked(Exception):
    """This device's chain forked on a target: it took a new device id (the caller restarts the cycle)."""


__all__ = ["COMMIT_BATCH", "ChainBase", "CycleResult", "DeviceForked", "Purge", "TargetRefused"]
