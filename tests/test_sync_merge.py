"""Sync's merge, property-tested: devices that write, edit, delete and forget while apart, and meet
through a real folder target in any order, end with the same records and versions, and lose no write.

Real vault stores (sealed logs on disk, cheap Argon2id), the real engine (:class:`TargetSync`) and a
real folder target; hypothesis chooses the interleaving. The daemon-level test with ``kill -9`` is
``tests/test_sync_devices.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memoriesd.memory.forget import purge
from memoriesd.sync.engine import DeviceForked, TargetSync
from memoriesd.sync.segments import Codec
from memoriesd.sync.stamps import Clock
from memoriesd.sync.state import SyncState, TargetState
from memoriesd.sync.transport import parse_target
from memoriesd.vault.keywrap import KdfParams
from memoriesd.vault.live import LiveVault
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import VaultStore
from memoriesd.vault.versions import heads, versions

PASS = b"correct horse"
CHEAP = KdfParams(memory_kib=64, iterations=1, lanes=1)


#: Every version any device made in the running example: stamp -> parents (the ground truth).
DAG: dict[str, tuple[str, ...]] = {}


def _ancestors(stamps: set[str]) -> set[str]:
    out: set[str] = set()
    todo = list(stamps)
    while todo:
        for p in DAG.get(todo.pop(), ()):
            if p not in out:
                out.add(p)
                todo.append(p)
    return out


class _NoIndex:
    rag = None


class Device:
    """One device: its own vault directory, store, sync state and engine on the shared target."""

    def __init__(self, root: Path, name: str, target: Path, origin: VaultStore | None) -> None:
        vault_dir = root / name
        if origin is None:
            self.store = VaultStore.create(vault_dir, "abcdefghijkl", "v", PASS, CHEAP)
        else:
            self.store = VaultStore.join(vault_dir, origin.shared_header(), PASS, lambda _k: "v")
        self.vault = LiveVault(self.store)
        self.state = SyncState(device=name * 16)
        self.state.targets["t1"] = TargetState(target=str(target), added=now())
        self.clock = Clock(self.state.device)
        self.store.stamper = self.clock
        self.codec = Codec(self.vault.keys, self.store.vault_id)
        self.sync = TargetSync(
            self.vault, self.state, "t1", parse_target(str(target)), self.codec, self.clock, lambda: None, self._purge
        )
        self.acked: dict[str, set[str]] = {}  # record id -> stamps this device's writes were acknowledged with

    def _purge(self, ids: list[str], stamps: dict[str, str]) -> None:
        purge(_NoIndex(), self.vault, ids, stamps=stamps)

    def cycle(self) -> None:
        for _ in range(2):
            try:
                self.sync.pull()
                self.sync.push()
                return
            except DeviceForked:  # pragma: no cover - never in this test
                raise

    def write(self, rid: str, body: str) -> None:
        revs = self.store.revisions(rid)
        last = revs[-1] if revs else None
        rev = (last.revision + 1) if last else 1
        rec = Record(rid, rev, "memory", f"t {rid}", body, False, (), created=now(), updated=now())
        self.store.commit([rec])
        made = self.store.revisions(rid)[-1]
        self.acked.setdefault(rid, set()).add(made.version)
        DAG[made.version] = made.parents

    def delete(self, rid: str) -> None:
        last = self.store.revisions(rid)[-1]
        self.store.commit([Record(rid, last.revision + 1, last.kind, "", "", False, (), created=last.created, updated=now(), deleted=True)])
        made = self.store.revisions(rid)[-1]
        DAG[made.version] = made.parents

    def forget(self, rid: str) -> None:
        self._purge([rid], {})

    def live_ids(self) -> list[str]:
        return sorted(r.id for r in self.store.latest())

    def known_ids(self) -> list[str]:
        return sorted(self.store.histories())

    def forgotten(self) -> set[str]:
        return {k[len("sync.forgot.") :] for k in self.store.setting_items("sync.forgot.")}

    def current(self) -> dict[str, tuple[str, str]]:
        return {r.id: (r.version, r.body) for r in self.store.latest()}

    def version_sets(self) -> dict[str, frozenset[str]]:
        out = {}
        for rid, revs in self.store.histories().items():
            known = versions(revs, self.store.conflicts.get(rid, ()), self.state.device)
            out[rid] = frozenset(heads(known))
        return out

    def close(self) -> None:
        self.codec.wipe()
        self.store.close()


class Convergence(RuleBasedStateMachine):
    """Three devices, one target, random work and random meetings."""

    def __init__(self) -> None:
        super().__init__()
        DAG.clear()
        self.root = Path(tempfile.mkdtemp(prefix="sm"))
        self.target = self.root / "target"
        self.target.mkdir()
        a = Device(self.root, "a", self.target, None)
        a.write("seed000000000000", "seed")
        a.cycle()
        self.devices = [a, Device(self.root, "b", self.target, a.store), Device(self.root, "c", self.target, a.store)]
        for d in self.devices[1:]:
            d.cycle()
        self.forgotten_texts: set[str] = set()
        self.n = 0

    def _text(self) -> str:
        self.n += 1
        return f"text-{self.n}"

    def _id(self) -> str:
        self.n += 1
        return f"rec{self.n:013d}"

    @rule(who=st.integers(0, 2))
    def add(self, who: int) -> None:
        self.devices[who].write(self._id(), self._text())

    @rule(who=st.integers(0, 2), pick=st.integers(0, 1000))
    def edit(self, who: int, pick: int) -> None:
        d = self.devices[who]
        ids = d.live_ids()
        if ids:
            d.write(ids[pick % len(ids)], self._text())

    @rule(who=st.integers(0, 2), pick=st.integers(0, 1000))
    def delete(self, who: int, pick: int) -> None:
        d = self.devices[who]
        ids = d.live_ids()
        if ids:
            d.delete(ids[pick % len(ids)])

    @rule(who=st.integers(0, 2), pick=st.integers(0, 1000))
    def forget(self, who: int, pick: int) -> None:
        d = self.devices[who]
        ids = d.live_ids()
        if ids:
            rid = ids[pick % len(ids)]
            self.forgotten_texts |= {r.body for r in d.store.revisions(rid) if not r.deleted}
            d.forget(rid)

    @rule(who=st.integers(0, 2))
    def meet(self, who: int) -> None:
        self.devices[who].cycle()

    @rule(who=st.integers(0, 2))
    def compact(self, who: int) -> None:
        """A compaction epoch (forced: other devices may not have applied everything yet)."""
        self.devices[who].sync.compact()

    @precondition(lambda self: True)
    @invariant()
    def no_forgotten_text_current(self) -> None:
        for d in self.devices:
            for rid in d.forgotten():
                assert not d.store.revisions(rid), "a forgotten record is still in the log of the device that knows the forget"

    def teardown(self) -> None:
        try:
            for _ in range(3):  # everyone meets everyone: push all, pull all
                for d in self.devices:
                    d.cycle()
            first = self.devices[0]
            for d in self.devices[1:]:
                assert d.current() == first.current(), "devices disagree on current records after meeting"
                assert d.version_sets() == first.version_sets(), "devices disagree on the heads of a record"
                assert d.forgotten() == first.forgotten()
            forgotten = first.forgotten()
            for d in self.devices:
                for rid, stamps in d.acked.items():
                    if rid in forgotten:
                        continue
                    for other in self.devices:
                        revs = other.store.revisions(rid)
                        held = {r.version for r in revs} | {r.version for r in other.store.conflicts.get(rid, [])}
                        # an acknowledged write is kept, or a version made after it (knowing it) is
                        for stamp in stamps:
                            assert stamp in held or stamp in _ancestors(held), "an acknowledged write is lost"
            for d in self.devices:
                texts = {r.body for revs in d.store.histories().values() for r in revs}
                texts |= {r.body for rs in d.store.conflicts.values() for r in rs}
                assert not (texts & self.forgotten_texts), "forgotten text survives on a device"
                log_bytes = b"".join(p.read_bytes() for p in (self.root / ("abc"[self.devices.index(d)])).glob("log-*.bin"))
                assert log_bytes  # sealed: the text is never in clear on disk
                for t in self.forgotten_texts:
                    assert t.encode() not in log_bytes
        finally:
            for d in self.devices:
                d.close()
            shutil.rmtree(self.root, ignore_errors=True)


Convergence.TestCase.settings = settings(
    max_examples=int(os.environ.get("MEMORIES_SYNC_EXAMPLES", "20")), stateful_step_count=25, deadline=None,
    suppress_health_check=list(HealthCheck), derandomize="MEMORIES_SYNC_EXAMPLES" not in os.environ,
)
test_devices_that_work_apart_converge_and_lose_no_write = Convergence.TestCase


def test_concurrent_edits_keep_both_one_current_and_one_conflict() -> None:
    root = Path(tempfile.mkdtemp(prefix="sm"))
    try:
        target = root / "target"
        target.mkdir()
        a = Device(root, "a", target, None)
        rid = new_record_id()
        a.write(rid, "first")
        a.cycle()
        b = Device(root, "b", target, a.store)
        b.cycle()
        a.write(rid, "edit on A")
        b.write(rid, "edit on B")
        a.cycle()
        b.cycle()
        a.cycle()
        assert a.current() == b.current()
        bodies: dict[str, Any] = {}
        for d in (a, b):
            revs = d.store.revisions(rid)
            known = versions(revs, d.store.conflicts.get(rid, ()), d.state.device)
            tops = heads(known)
            assert len(tops) == 2, "both concurrent edits are heads"
            bodies[d.state.device] = sorted(known[s].record.body for s in tops)
        assert list(bodies.values())[0] == list(bodies.values())[1] == ["edit on A", "edit on B"]
        # an edit made after seeing both resolves the conflict on both devices
        a.write(rid, "resolved")
        a.cycle()
        b.cycle()
        for d in (a, b):
            revs = d.store.revisions(rid)
            assert revs[-1].body == "resolved"
            assert len(heads(versions(revs, d.store.conflicts.get(rid, ()), d.state.device))) == 1
        a.close()
        b.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
