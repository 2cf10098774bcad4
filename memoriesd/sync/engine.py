"""One sync cycle with one target: pull what other devices published, push what this device wrote.

Trust nothing the target serves (issue 30, item 5). A file that does not open (incomplete, damaged,
another vault's, renamed) is skipped and retried; a device's segments are applied only in chain order
(number + 1 and the previous segment's digest), so a dropped, reordered or replayed segment waits or
is ignored, and a chain that forks (the same number with other bytes, or this device's own chain
ahead of this device) is refused and reported. What is refused is counted in ``problems`` for
``sync status``; nothing of it is ever applied, and nothing local is ever removed because of it.

Epochs: a compaction (:meth:`TargetSync.compact`) writes every record's heads as *base* segments of
a new epoch, then an epoch marker naming them and what of each device they cover (``cut``), then
removes the old epoch's files. A device that meets a newer marker applies the base and publishes
again whatever of its own the cut does not cover.
"""

from __future__ import annotations

import copy
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
from .merge import BadVersion, check_wire, plan, to_wire
from .segments import (
    EPOCH,
    HEADER_FILE,
    MAX_FILE_BYTES,
    NAME_RE,
    SEGMENT,
    SEGMENT_PLAIN_BYTES,
    TIP,
    Codec,
    Opened,
    Unreadable,
    digest,
    read_target_header,
    target_header_bytes,
    whole_size,
)
from .stamps import Clock, new_device_id
from .state import Peer, SyncState, TargetState
from .transport import Transport

log = logging.getLogger("memoriesd.sync")

#: Entries committed per log write while a pull applies many versions (a join).
COMMIT_BATCH = 2000
#: A file that still does not open after this long is reported (before: it may still be arriving).
UNREADABLE_GRACE_SECONDS = 60.0
#: This device's last segment is read again on each pull when it is at most this large.
OWN_REREAD_BYTES = 256 << 10
#: Markers of copies that sync tools make beside a file they could not reconcile.
CONFLICT_MARKERS = (".sync-conflict-", " (conflicted copy", "conflict")


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


class TargetSync:
    """Pull, push and compaction for one (vault, target). Not thread-safe: one cycle at a time."""

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

    # ------------------------------------------------------------------ pull

    def pull(self) -> CycleResult:
        self.activity = "reading the target"
        try:
            return self._pull()
        finally:
            self.activity = "idle"

    def _pull(self) -> CycleResult:
        out = CycleResult()
        self._finish_forgets()
        ts = self.ts
        listing = self.transport.list()
        names = {e.name: e.size for e in listing}
        self._note_strays(names)
        if HEADER_FILE in names:
            out.header_adopted = self._read_header()
        # This device's last segment is read again: another copy of this home may have written over
        # it (a large one, a compaction's base, is not: reading it on every pull would cost too much).
        last_own = self.codec.segment_name(self.device, ts.epoch, ts.seq) if ts.seq else ""
        if names.get(last_own, 0) > OWN_REREAD_BYTES:
            last_own = ""
        if not any(size > MAX_FILE_BYTES and NAME_RE.match(n) for n, size in names.items()):
            ts.problems.pop("oversized", None)  # reported while such a file is there
        for name, size in sorted(names.items()):
            if not NAME_RE.match(name) or name in ts.files and ts.files[name][0] != TIP and name != last_own:
                continue
            if size > MAX_FILE_BYTES:
                self._problem("oversized", f"{name} is larger than any sync file: ignored")
                continue
            data = self.transport.read(name)
            if data is None:
                continue
            try:
                opened = self.codec.open(name, data)
            except Unreadable:
                # A file of a whole sealed size is reported at once; another may still be arriving.
                first = self._unreadable[name] = 0.0 if whole_size(len(data)) else self._unreadable.get(name, time.time())
                if time.time() - first > UNREADABLE_GRACE_SECONDS:
                    self._problem("unreadable", f"{self._count_unreadable()} file(s) on the target do not open (incomplete, damaged, or another vault's): ignored")
                continue
            self._unreadable.pop(name, None)
            self._take(name, opened)
        if not self._count_unreadable():
            ts.problems.pop("unreadable", None)
        for gone in set(self._ahead) - set(names):
            self._ahead.pop(gone)
        self._switch_epoch(out)
        self._drop_orphans()
        self._note_own_gone(names)
        self._apply_inbox(out)
        self.clock.mark_published(self.tid, ts.upto)
        ts.last_pull = time.time()
        self._save()
        return out

    def _note_own_gone(self, names: dict[str, int]) -> None:
        """This device's segments of this epoch gone from the target (deleted, or the target restored
        from an old copy): other devices cannot get those changes until a compaction writes them again."""
        ts = self.ts
        gone = [n for n, f in ts.files.items() if f[0] == SEGMENT and f[1] == self.device and f[2] == ts.epoch and n not in names]
        if gone:
            self._problem(
                "own_gone",
                f"{len(gone)} of this device's segments are gone from the target (deleted, or restored from an old copy): "
                f"other devices cannot get those changes; run `memories sync compact {self.vault.name} --force` to write everything again",
            )
        else:
            ts.problems.pop("own_gone", None)

    def _note_strays(self, names: dict[str, int]) -> None:
        copies = [n for n in names if any(m in n for m in CONFLICT_MARKERS)]
        if copies:
            self._problem("conflict_copies", f"{len(copies)} conflict cop{'y' if len(copies) == 1 else 'ies'} made by the sync tool: ignored (safe to delete)")
        else:
            self.ts.problems.pop("conflict_copies", None)
        if not self._unreadable or not (set(self._unreadable) & set(names)):
            self.ts.problems.pop("unreadable", None)
        for gone in set(self._unreadable) - set(names):
            self._unreadable.pop(gone, None)

    def _count_unreadable(self) -> int:
        return sum(1 for t in self._unreadable.values() if time.time() - t > UNREADABLE_GRACE_SECONDS)

    def _problem(self, kind: str, text: str) -> None:
        if self.ts.problems.get(kind) != text:
            log.warning("sync %s: %s", self.tid, text)
        self.ts.problems[kind] = text

    def _read_header(self) -> bool:
        """Follow a passphrase change made on another device (its header, authentic under this key,
        newer than the one this device has); refuse a target whose header is another vault's or
        wraps another key (a key change elsewhere: ``sync adopt-key``)."""
        data = self.transport.read(HEADER_FILE)
        if data is None:
            return False
        try:
            th = read_target_header(data)
        except ValueError:
            self._problem("header", "the target's memories-sync.json is damaged: sync stopped; restore the file, or remove the target")
            raise TargetRefused(self.ts.problems["header"]) from None
        if th.header.vault_id != self.store.vault_id:
            self._problem("header", "the target's memories-sync.json is another vault's: sync stopped; restore the file, or remove the target")
            raise TargetRefused(self.ts.problems["header"]) from None
        if not self.store.shares_key(th.header):
            self._problem(
                "header",
                f"the vault's key was changed on another device (vault passwd --rekey): run `memories sync adopt-key {self.store.name}` "
                "with the new passphrase",
            )
            raise TargetRefused(self.ts.problems["header"]) from None
        try:
            meta = json.loads(self.codec.open_name(th.sealed_name))
            wrapped = float(meta.get("wrapped", 0.0))
        except (ValueError, Unreadable, AttributeError):
            self._problem("header", "the target's memories-sync.json is damaged: sync stopped; restore the file, or remove the target")
            raise TargetRefused(self.ts.problems["header"]) from None
        self.ts.problems.pop("header", None)
        if self.ts.header_wrap and self.store.header.wrap != self.ts.header_wrap:
            return False  # the passphrase changed here since: this device's header goes to the target (push)
        if wrapped <= self.ts.wrap_time:
            self.ts.header_wrap = self.ts.header_wrap or self.store.header.wrap
            return False
        changed = self.store.adopt_wrap(th.header)
        self.ts.wrap_time = wrapped
        self.ts.header_wrap = self.store.header.wrap
        if changed:
            log.info("sync %s: the vault's passphrase was changed on another device: this device's header follows", self.tid)
        return changed

    def _take(self, name: str, opened: Opened) -> None:
        """Sort one opened file: a tip updates what is known of its device, a segment waits in the
        inbox until its chain reaches it, a marker is kept for the epoch switch."""
        ts, d = self.ts, opened.doc
        device = str(d.get("device", ""))
        if opened.kind == TIP:
            peer = ts.peers.setdefault(device, Peer())
            # An older tip than one read before: a tip that lags behind segments is only in transit.
            older = float(d.get("time", 0.0)) < peer.seen
            peer.seen = max(peer.seen, float(d.get("time", 0.0)))
            peer.label = str(d.get("label", ""))[:64]
            acks = d.get("acks")
            peer.acks = {str(k): int(v) for k, v in acks.items()} if isinstance(acks, dict) else {}
            seq = int(d.get("seq", 0))
            if device == self.device and int(d.get("epoch", 0)) == ts.epoch and (seq > ts.seq or seq == ts.seq and d.get("hash") != ts.hash):
                self._own_ahead(seq)
            elif device != self.device and int(d.get("epoch", 0)) == ts.epoch and older and seq < peer.seq:
                self._problem(f"rolled_back {device}", f"device {peer.label or device} shows fewer changes on the target than this device has seen (rolled back or restored from an old copy): this device keeps them")
            elif device != self.device and not older:
                ts.problems.pop(f"rolled_back {device}", None)
            peer.tip_seq = max(peer.tip_seq, seq)
            return
        if opened.kind == EPOCH:
            self._markers[name] = opened
            return
        epoch, seq = int(d["epoch"]), int(d["seq"])
        if epoch < ts.epoch:
            ts.files[name] = [SEGMENT, device, epoch, seq, opened.digest]
            return
        if epoch > ts.epoch:  # a compaction's base (or what follows it): waits for its epoch's marker
            self._ahead[name] = opened
            return
        self._inbox.setdefault(device, {})[seq] = (name, opened)

    def _own_ahead(self, seq: int) -> None:
        """The target shows this device's chain further than this device wrote it: the home was
        copied to another machine, or restored from an older backup. This device never continues a
        chain that is not its own: it takes a new device id and publishes everything again."""
        old = self.device
        agreed, agreed_hash = self._agreed(min(self.ts.seq, seq - 1))
        top = self._top_stamp()
        self.state.origin = self.state.origin or old
        self.state.device = new_device_id()
        for t in self.state.targets.values():
            # The old id's chain is now the other copy's: it is applied from where the two agree
            # (its own files above that are read again), and everything this device holds under
            # the old id is published again under the new one (the other copy may have written
            # over some of it; receivers keep one of each stamp).
            if t is self.ts:
                t.files = {n: f for n, f in t.files.items() if not (f[0] == SEGMENT and f[1] == old and f[3] > agreed)}
                t.peers[old] = Peer(seq=agreed, hash=agreed_hash, seen=time.time(), tip_seq=seq)
            else:
                t.peers[old] = Peer(seq=t.seq, hash=t.hash, seen=time.time(), tip_seq=t.seq)
            t.former[old] = ["", top]
            t.seq, t.hash, t.upto, t.own = 0, "", "", []
        self._problem("forked", f"this device's history on the target went further than this device (seq {seq}): the home was copied or restored; it now syncs as a new device")
        log.warning("sync %s: device %s forked on the target: now device %s", self.tid, old, self.state.device)
        raise DeviceForked(self.state.device)

    def _top_stamp(self) -> str:
        """The highest stamp of this device among the vault's versions and forgets ("" if none)."""
        stamps = [s for rid, revs in self.store.histories().items() for s in versions(revs, self.store.conflicts.get(rid, ()), self.clock.origin)]
        stamps += [s for s in self.store.setting_items(FORGOT_PREFIX).values() if isinstance(s, str)]
        return max((s for s in stamps if stamp_device(s) == self.device), default="")

    def _agreed(self, seq: int) -> tuple[int, str]:
        """The last of this device's segments, from ``seq`` down, that the target holds as this
        device wrote it (a missing one counts as held: dropped files are not another writer)."""
        ts = self.ts
        own = {f[3]: (n, str(f[4])) for n, f in ts.files.items() if f[0] == SEGMENT and f[1] == self.device and f[2] == ts.epoch}
        while seq > 0 and seq in own:
            name, dig = own[seq]
            data = self.transport.read(name)
            if data is None or digest(data) == dig:
                return seq, dig
            seq -= 1
        return seq, own[seq][1] if seq in own else ""

    def _accepts(self, peer: Peer, seq: int, opened: Opened) -> bool:
        prev = str(opened.doc.get("prev", ""))
        if peer.hash == "":  # the first segment of this epoch's chain: anything above what we applied
            return prev == "" and seq > peer.seq
        return seq == peer.seq + 1 and prev == peer.hash

    def _apply_inbox(self, out: CycleResult) -> None:
        """Apply every device's segments that continue its chain here; cursors move only once the
        versions are committed (a failed merge leaves them, and the files are read again)."""
        ts = self.ts
        ready: list[dict[str, Any]] = []
        moves: list[tuple[Peer, int, str, str, list[Any]]] = []
        gaps: list[str] = []
        for device, waiting in list(self._inbox.items()):
            if device == self.device:
                self._check_own(waiting)
                continue
            peer = ts.peers.setdefault(device, Peer())
            seq_at, hash_at = peer.seq, peer.hash
            for seq in sorted(s for s in waiting if s <= seq_at):  # replayed or already applied
                del waiting[seq]
            while waiting:
                seq = min(waiting)
                name, opened = waiting[seq]
                cursor = Peer(seq=seq_at, hash=hash_at)
                if not self._accepts(cursor, seq, opened):
                    if hash_at and seq == seq_at + 1:  # the next number, but not made after the last one
                        self._problem("fork", f"device {peer.label or device}'s history on the target forked (two devices with one id, or files were altered): its later changes are not applied")
                    else:
                        gaps.append(peer.label or device)
                    break
                try:
                    batch = [check_wire(v) for v in opened.doc.get("versions", [])]
                except BadVersion:
                    self._problem("malformed", f"a segment of device {peer.label or device} holds a malformed version: its later changes are not applied")
                    break
                ready.extend(batch)
                del waiting[seq]
                seq_at, hash_at = seq, opened.digest
                moves.append((peer, seq, opened.digest, name, [SEGMENT, device, int(opened.doc["epoch"]), seq, opened.digest]))
            if not waiting:
                self._inbox.pop(device, None)
        if gaps:
            self._problem("missing", f"changes of {', '.join(sorted(set(gaps)))} are missing from the target (not arrived yet, or deleted): later ones wait")
        else:
            ts.problems.pop("missing", None)
        if ready:
            self._merge(ready, out)
        for peer, seq, digest_, name, record in moves:
            peer.seq, peer.hash = seq, digest_
            peer.tip_seq = max(peer.tip_seq, seq)
            ts.files[name] = record

    def _check_own(self, waiting: dict[int, tuple[str, Opened]]) -> None:
        ts = self.ts
        for seq, (name, opened) in sorted(waiting.items()):
            if seq <= ts.seq:
                known = ts.files.get(name)
                if known is not None and known[4] != opened.digest:
                    self._own_ahead(seq)
                ts.files.setdefault(name, [SEGMENT, self.device, ts.epoch, seq, opened.digest])
                continue
            # A segment this device wrote but did not record (a crash between the write and the
            # state): adopt it when every version in it is here, else the chain is not ours.
            stamps = [v.get("v") for v in opened.doc.get("versions", []) if isinstance(v, dict)]
            if seq == ts.seq + 1 and opened.doc.get("prev", "") == ts.hash and self._have(stamps):
                ts.seq, ts.hash = seq, opened.digest
                ts.upto = max([ts.upto, *[s for s in stamps if isinstance(s, str) and stamp_device(s) == self.device]])
                ts.own.append([seq, ts.upto])
                ts.files[name] = [SEGMENT, self.device, ts.epoch, seq, opened.digest]
                continue
            self._own_ahead(seq)
        self._inbox.pop(self.device, None)

    def _have(self, stamps: list[Any]) -> bool:
        mine: set[str] = set()
        for rid, revs in self.store.histories().items():
            mine.update(versions(revs, self.store.conflicts.get(rid, ()), self.device))
        forgot = set(self.store.setting_items(FORGOT_PREFIX).values())
        return all(s in mine or s in forgot for s in stamps)

    def _finish_forgets(self) -> None:
        """Purge again the records marked forgotten whose revisions the log still holds: a purge cut
        between its commit (deletion and mark) and its log compaction. No one retries a forget
        received by sync, and a received forget whose mark is set is not applied again."""
        left = {k[len(FORGOT_PREFIX) :]: v for k, v in self.store.setting_items(FORGOT_PREFIX).items()}
        left = {rid: stamp for rid, stamp in left.items() if self.store.revisions(rid)}
        if left:
            log.info("sync %s: finishing %d forget(s) a stop interrupted", self.tid, len(left))
            self._purge(list(left), left)

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

    # ------------------------------------------------------------------ push

    def push(self) -> CycleResult:
        try:
            return self._push()
        finally:
            self.activity = "idle"

    def _push(self) -> CycleResult:
        out = CycleResult()
        ts = self.ts
        self._write_header_if_needed()
        own = self._unpublished()
        if own:
            self.activity = f"publishing {len(own):,} versions"
        chunk: list[dict[str, Any]] = []
        size = 0
        for v in own:
            n = len(json.dumps(v, ensure_ascii=False))
            # Never between two versions of one stamp (revisions from before the vault synced can
            # share a derived stamp): what is published is everything up to a stamp.
            if chunk and size + n > SEGMENT_PLAIN_BYTES and chunk[-1]["v"] != v["v"]:
                self._write_segment(chunk, out)
                chunk, size = [], 0
            chunk.append(v)
            size += n
        if chunk:
            self._write_segment(chunk, out)
        ts.former.clear()  # published again (under this device's chain) with the rest
        if out.segments or self._tip_stale():
            self._write_tip()
        ts.last_push = time.time()
        self._save()
        return out

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

    # ------------------------------------------------------------------ epochs

    def forget_acked(self, device_days: float) -> bool:
        """Whether every device seen in the last ``device_days`` days has applied this device's last forget."""
        ts = self.ts
        if ts.forget_seq == 0:
            return False
        horizon = time.time() - device_days * 86400
        return all(p.acks.get(self.device, 0) >= ts.forget_seq for d, p in ts.peers.items() if d != self.device and p.seen >= horizon)

    def compact(self) -> dict[str, Any]:
        """Rewrite the target as a new epoch: base segments with every record's heads, a marker,
        then the old epoch's files removed (what was forgotten is in none of them)."""
        self.pull()
        base = self._new_epoch()
        removed = self._remove_old(set(base), everything=False)
        log.info("sync %s: compacted into epoch %d (%d base segment(s), %d file(s) removed)", self.tid, self.ts.epoch, len(base), removed)
        return {"epoch": self.ts.epoch, "base_segments": len(base), "files_removed": removed}

    def rekey_target(self) -> dict[str, Any]:
        """After a key change here: the target written again under the new key (a new epoch, the
        header that wraps it), and every file under the old key removed. Other devices take the
        new key with ``memories sync adopt-key`` and the new passphrase."""
        ts = self.ts
        base = self._new_epoch()
        self._write_header(force=True)
        removed = self._remove_old(set(base), everything=True)
        ts.rekey = False
        self._save()
        log.info("sync %s: written again under the vault's new key (epoch %d, %d old file(s) removed)", self.tid, ts.epoch, removed)
        return {"epoch": ts.epoch, "base_segments": len(base), "files_removed": removed}

    def _new_epoch(self) -> list[str]:
        """Base segments of the next epoch with every record's heads, its marker and this device's
        tip; the names written. Until the marker is written the state stays where it was, in memory
        and on disk (a failure or a power cut leaves only base segments, which the next pull removes)."""
        before = copy.deepcopy(self.ts)
        try:
            return self._write_epoch()
        except BaseException:
            self.state.targets[self.tid] = before
            raise

    def _write_epoch(self) -> list[str]:
        ts = self.ts
        cut = {d: p.seq for d, p in ts.peers.items() if d != self.device}
        cut[self.device] = ts.seq
        ts.epoch += 1
        ts.hash = ""
        ts.own = []
        out = CycleResult()
        base: list[str] = []
        chunk: list[dict[str, Any]] = []
        size = 0
        heads_now = self._heads()
        for v in heads_now:
            n = len(json.dumps(v, ensure_ascii=False))
            if chunk and size + n > SEGMENT_PLAIN_BYTES:
                base.append(self._write_segment(chunk, out, base=True, save=False))
                chunk, size = [], 0
            chunk.append(v)
            size += n
        # The state moves to the new epoch only with its marker (saved below): a power cut before
        # leaves base segments no marker announces, which the next pull removes (_drop_orphans).
        base.append(self._write_segment(chunk, out, base=True, save=False))
        ts.upto = max([ts.upto, *[v["v"] for v in heads_now if stamp_device(v["v"]) == self.device]])
        self.clock.mark_published(self.tid, ts.upto)
        marker_name = self.codec.epoch_name(ts.epoch, self.device)
        marker = {"device": self.device, "epoch": ts.epoch, "base": base, "cut": cut, "time": time.time()}
        self.transport.write(marker_name, self.codec.seal(EPOCH, marker))
        self._write_tip()
        for peer in ts.peers.values():
            peer.hash = ""
        ts.forget_seq = 0
        ts.problems.pop("fork", None)
        self._save()
        return [*base, marker_name, self.codec.tip_name(self.device)]

    def _remove_old(self, keep: set[str], *, everything: bool) -> int:
        """Remove the files of older epochs (segments and markers; ``everything``: every sync file
        but ``keep``, tips and files that do not open included: a key change)."""
        ts = self.ts
        removed = 0
        for entry in self.transport.list():
            name = entry.name
            if not NAME_RE.match(name) or name in keep:
                continue
            if not everything:
                # Read, not taken from ts.files: a record there may predate a fork or a stop, and
                # what this removes must be exactly the older epochs' files.
                data = self.transport.read(name)
                try:
                    opened = self.codec.open(name, data or b"")
                except Unreadable:
                    continue
                if opened.kind == TIP or int(opened.doc.get("epoch", 0)) >= ts.epoch:
                    continue
            self.transport.delete(name)
            ts.files.pop(name, None)
            self._markers.pop(name, None)
            removed += 1
        self._save()
        return removed

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

    def _drop_orphans(self) -> None:
        """This device's segments of a later epoch that no marker of its own announces: the base of a
        compaction a power cut interrupted before its marker. The state never moved to that epoch;
        the files are removed (other devices ignore them: no marker)."""
        announced = {int(o.doc["epoch"]) for o in self._markers.values() if str(o.doc.get("device")) == self.device}
        for name, opened in list(self._ahead.items()):
            if str(opened.doc.get("device")) == self.device and int(opened.doc["epoch"]) not in announced:
                self.transport.delete(name)
                self._ahead.pop(name)
                log.warning("sync %s: removed a compaction's segment that a stop left without its marker", self.tid)

    def _switch_epoch(self, out: CycleResult) -> None:
        """A newer epoch marker: apply its base, publish again what of this device it does not cover."""
        ts = self.ts
        newer = [o for o in self._markers.values() if int(o.doc["epoch"]) > ts.epoch]
        if not newer:
            return
        top = max(int(o.doc["epoch"]) for o in newer)
        marker = min((o for o in newer if int(o.doc["epoch"]) == top), key=lambda o: str(o.doc["device"]))
        d = marker.doc
        by = str(d["device"])
        base: list[tuple[str, Opened]] = []
        batch: list[dict[str, Any]] = []
        for name in [str(n) for n in d.get("base", [])]:
            data = self.transport.read(name)
            if data is None:
                return  # the base is still arriving: switch on a later pull
            try:
                opened = self.codec.open(name, data)
                batch.extend(check_wire(v) for v in opened.doc.get("versions", []))
            except (Unreadable, BadVersion):
                return
            base.append((name, opened))
        cut = {str(k): int(v) for k, v in d.get("cut", {}).items()}
        mine = cut.get(self.device, 0)
        if ts.seq > mine:  # what this device published after the cut is published again
            covered = [u for s, u in ts.own if s <= mine]
            ts.upto = covered[-1] if covered else ""
            self.clock.mark_published(self.tid, ts.upto)
        ts.epoch, ts.hash, ts.own = top, "", []
        ts.files = {n: f for n, f in ts.files.items() if f[2] >= top}
        for dev, peer in ts.peers.items():
            peer.hash = ""
            peer.seq = max(peer.seq, cut.get(dev, 0))
        self._inbox = {dev: {s: x for s, x in w.items() if int(x[1].doc["epoch"]) >= top} for dev, w in self._inbox.items()}
        base_names = {name for name, _ in base}
        if batch:
            self._merge(batch, out)
        if by == self.device:
            # This device's own compaction, whose state a power cut lost after the marker was
            # written: its chain continues after the base.
            for name, opened in base:
                seq = int(opened.doc["seq"])
                ts.files[name] = [SEGMENT, by, top, seq, opened.digest]
                if seq >= ts.seq:
                    ts.seq, ts.hash = seq, opened.digest
            ts.own = [[ts.seq, ts.upto]]
        else:
            peer = ts.peers.setdefault(by, Peer())
            for name, opened in base:
                seq = int(opened.doc["seq"])
                ts.files[name] = [SEGMENT, by, top, seq, opened.digest]
                if seq >= peer.seq:
                    peer.seq, peer.hash = seq, opened.digest
        ahead, self._ahead = self._ahead, {}
        for name, opened in ahead.items():
            if name not in base_names:
                self._take(name, opened)  # what followed the base waits in the inbox now (or still ahead)
        ts.problems.pop("fork", None)
        log.info("sync %s: moved to epoch %d written by device %s", self.tid, top, by)


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


__all__ = ["CycleResult", "DeviceForked", "TargetRefused", "TargetSync"]
