"""One sync cycle with one target: pull what other devices published, push what this device wrote.

Trust nothing the target serves (issue 30, item 5). A file that does not open (incomplete, damaged,
another vault's, renamed) is skipped and retried; a device's segments are applied only in chain order
(number + 1 and the previous segment's digest), so a dropped, reordered or replayed segment waits or
is ignored, and a chain that forks (the same number with other bytes, or this device's own chain
ahead of this device) is refused and reported. What is refused is counted in ``problems`` for
``sync status``; nothing of it is ever applied, and nothing local is ever removed because of it.

Epochs (compaction, key changes) are :mod:`.epochs`; this device's chain, merging and the base
of an epoch are :mod:`.chain`. :class:`TargetSync` joins the three.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ..memory.forget import FORGOT_PREFIX
from ..vault.versions import stamp_device, versions
from .chain import CycleResult, DeviceForked, Purge, TargetRefused
from .epochs import Epochs
from .merge import BadVersion, check_wire
from .segments import (
    EPOCH,
    HEADER_FILE,
    MAX_FILE_BYTES,
    NAME_RE,
    SEGMENT,
    SEGMENT_PLAIN_BYTES,
    TIP,
    Opened,
    Unreadable,
    digest,
    read_target_header,
    whole_size,
)
from .stamps import new_device_id
from .state import Peer

log = logging.getLogger("memoriesd.sync")

#: A file that still does not open after this long is reported (before: it may still be arriving).
UNREADABLE_GRACE_SECONDS = 60.0
#: This device's last segment is read again on each pull when it is at most this large.
OWN_REREAD_BYTES = 256 << 10
#: Markers of copies that sync tools make beside a file they could not reconcile.
CONFLICT_MARKERS = (".sync-conflict-", " (conflicted copy", "conflict")


class TargetSync(Epochs):
    """Pull and push for one (vault, target), on top of its chain and epochs. Not thread-safe: one cycle at a time."""

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


__all__ = ["CycleResult", "DeviceForked", "Purge", "TargetRefused", "TargetSync"]
