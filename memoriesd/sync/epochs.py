"""Epochs of a target: compaction (a new epoch's base, its marker, the old files removed), a key
change written to the target, and following another device's epoch.

A compaction writes every record's heads as *base* segments of a new epoch, then an epoch marker
naming them and what of each device they cover (``cut``), then removes the old epoch's files. The
state moves to the new epoch only with the marker. A device that meets a newer marker applies the
base and publishes again whatever of its own the cut does not cover.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

from ..vault.versions import stamp_device
from .chain import ChainBase, CycleResult
from .merge import BadVersion, check_wire
from .segments import (
    EPOCH,
    NAME_RE,
    SEGMENT,
    SEGMENT_PLAIN_BYTES,
    TIP,
    Opened,
    Unreadable,
)
from .state import Peer

log = logging.getLogger("memoriesd.sync")


class Epochs(ChainBase):
    """Compaction and key changes of one (vault, target) (see the module docstring)."""

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


__all__ = ["Epochs"]
