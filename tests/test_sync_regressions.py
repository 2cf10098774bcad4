"""Minimal reproductions of what the daemon-level convergence test (tests/test_sync_devices.py) found,
each on real vault stores (sealed logs on disk, cheap Argon2id), the real engine and a real folder
target where sync is involved, the versions or the power cut placed exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memoriesd.memory.forget import KEEP_ALL
from memoriesd.sync.base import Entry, Transport
from memoriesd.sync.engine import TargetSync
from memoriesd.sync.transport import parse_target
from memoriesd.vault.keywrap import KdfParams
from memoriesd.vault.records import Record, now
from memoriesd.vault.store import Setting, VaultStore
from memoriesd.vault.versions import FORGOT_PREFIX, heads, versions

from .test_sync_merge import Device

PASS = b"correct horse"
CHEAP = KdfParams(memory_kib=64, iterations=1, lanes=1)
A, B = "a" * 16, "b" * 16


def _stamp(hlc: int, device: str) -> str:
    return f"{hlc:016x}-{device}"


def _tomb(rid: str, rev: int, created: float, stamp: str, parent: str) -> Record:
    """A synced deletion of ``rid`` made from ``parent``."""
    return Record(rid, rev, "memory", "", "", False, (), created=created, updated=now(), deleted=True, version=stamp, parents=(parent,))


def _put(rid: str, rev: int, body: str, stamp: str, parents: list[str], *, conflict: bool = False) -> Record:
    t = now()
    return Record(
        rid,
        rev,
        "memory",
        "t",
        body,
        False,
        (),
        created=t,
        updated=t,
        version=stamp,
        parents=tuple(parents),
        conflict=conflict,
    )


def _heads(store: VaultStore, rid: str) -> list[str]:
    return heads(versions(store.revisions(rid), store.conflicts.get(rid, ()), A))


def test_compaction_of_a_deleted_record_does_not_turn_a_resolved_conflict_revision_into_a_head(
    tmp_path: Path,
) -> None:
    """A deleted synced record keeps only its tombstone when the log is compacted (a forget compacts
    it); a conflict revision that a later version resolved must go with the revisions, or it names
    nothing that is kept, no kept version names it, and it becomes a head: `sync status` lists a
    conflict on this device that the other device (which held the same version as a plain revision,
    dropped by its compaction) does not have."""
    rid = "rec0000000000001"
    s1, s2, s3, s4 = _stamp(1 << 16, A), _stamp(2 << 16, B), _stamp(3 << 16, B), _stamp(4 << 16, A)
    store = VaultStore.create(tmp_path / "v", "abcdefghijkl", "v", PASS, CHEAP)
    try:
        store.commit([_put(rid, 1, "first", s1, [])])
        store.commit([_put(rid, 1, "B's edit, kept as a conflict", s2, [s1], conflict=True)])
        store.commit([_put(rid, 2, "B's next edit, made from it", s3, [s2])])
        tomb = store.revisions(rid)[-1]
        store.commit([_tomb(rid, 3, tomb.created, s4, s3)])
        assert _heads(store, rid) == [s4]  # one head: the deletion, made after every other version

        store.compact(KEEP_ALL)

        assert store.revisions(rid)[-1].deleted
        assert _heads(store, rid) == [s4], "a compaction made a resolved version a head again"
    finally:
        store.close()


class PowerCut(Exception):
    """The process died here (the test then goes on with what was saved, as a restart would)."""


class CutBefore:
    """A real folder target that dies before writing one file (a power cut at that point of a push)."""

    def __init__(self, inner: Transport, name: str) -> None:
        self.inner = inner
        self.name = name
        self.scheme = inner.scheme

    def describe(self) -> str:
        return self.inner.describe()

    def list(self) -> list[Entry]:
        return self.inner.list()

    def read(self, name: str) -> bytes | None:
        return self.inner.read(name)

    def write(self, name: str, data: bytes) -> None:
        if name == self.name:
            raise PowerCut(name)
        self.inner.write(name, data)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def ensure(self) -> None:
        self.inner.ensure()


def test_a_power_cut_inside_a_target_compaction_does_not_stop_the_device_applying_other_devices(
    tmp_path: Path,
) -> None:
    """A compaction cut between its base segments and its epoch marker: the device's state stays in
    the old epoch (it moves only with the marker), the next pull removes the base segments no marker
    announces, and the other devices hold them aside (a later epoch) instead of calling them a fork.
    Before, the state moved with the first base segment: the device then ignored every segment the
    others wrote (B's change never arrived) and they reported its base as a fork."""
    target = tmp_path / "target"
    target.mkdir()
    a = Device(tmp_path, "a", target, None)
    a.write("rec0000000000001", "on a before the cut")
    a.cycle()
    b = Device(tmp_path, "b", target, a.store)
    b.cycle()
    marker = a.codec.epoch_name(a.sync.ts.epoch + 1, a.state.device)
    a.sync.transport = CutBefore(a.sync.transport, marker)
    with pytest.raises(PowerCut):
        a.sync.compact()
    # The restart: what was saved (the in-memory state is what the base segment's save wrote) and a new engine.
    a.sync = TargetSync(
        a.vault, a.state, "t1", parse_target(str(target)), a.codec, a.clock, lambda: None, a._purge
    )

    b.write("rec0000000000002", "on b after a's cut")
    for d in (b, a, b, a):
        d.cycle()
    try:
        assert "rec0000000000002" in a.current(), "B's change never reaches A after A's cut compaction"
        assert "fork" not in b.state.targets["t1"].problems, b.state.targets["t1"].problems
    finally:
        a.close()
        b.close()


def test_a_forget_cut_between_its_deletion_and_the_log_compaction_is_finished_by_the_next_sync(
    tmp_path: Path,
) -> None:
    """``purge`` commits the deletion with the ``sync.forgot.<id>`` mark, then compacts the log. Cut
    between the two (a forget received by sync, with no one to retry it), the log kept the record's
    text under a forget already marked done: the next received copy of the forget was skipped (the
    mark said it was applied) and nothing compacted the log again until some other forget."""
    target = tmp_path / "target"
    target.mkdir()
    a = Device(tmp_path, "a", target, None)
    rid = "rec0000000000001"
    a.write(rid, "text b will forget")
    a.cycle()
    b = Device(tmp_path, "b", target, a.store)
    b.cycle()
    b.forget(rid)
    b.cycle()
    # What A's log holds when its purge of the received forget is cut after its first commit: the
    # deletion and the mark (with the forget's stamp), every earlier revision still there.
    stamp = b.store.setting_items(FORGOT_PREFIX)[FORGOT_PREFIX + rid]
    last = a.store.revisions(rid)[-1]
    tomb = Record(
        rid,
        last.revision + 1,
        last.kind,
        "",
        "",
        False,
        (),
        created=last.created,
        updated=now(),
        deleted=True,
    )
    a.store.commit([tomb, Setting(FORGOT_PREFIX + rid, stamp)])
    assert any(r.body == "text b will forget" for r in a.store.revisions(rid))
    a.sync = TargetSync(
        a.vault, a.state, "t1", parse_target(str(target)), a.codec, a.clock, lambda: None, a._purge
    )
    try:
        a.cycle()
        assert not a.store.revisions(rid), "the forgotten text is still in A's log after a sync"
    finally:
        a.close()
        b.close()


def test_compaction_keeps_a_deletion_in_the_history_of_a_record_another_device_brought_back(
    tmp_path: Path,
) -> None:
    """A deletion here, then an edit from another device that names it (the record is back): the
    deletion is one of the record's versions, held by every device. A forget's log compaction kept
    only the revisions that are not deletions, so this device alone lost that version: `memory
    history` differed between the devices (the other kept it)."""
    rid = "rec0000000000001"
    s1, s2, s3 = _stamp(1 << 16, A), _stamp(2 << 16, A), _stamp(3 << 16, B)
    store = VaultStore.create(tmp_path / "abcdefghijkl", "abcdefghijkl", "v", PASS, CHEAP)
    try:
        store.commit([_put(rid, 1, "first", s1, [])])
        first = store.revisions(rid)[-1]
        store.commit([_tomb(rid, 2, first.created, s2, s1)])
        store.commit([_put(rid, 3, "B's edit after the deletion", s3, [s2])])
        before = set(versions(store.revisions(rid), store.conflicts.get(rid, ()), A))

        store.compact(KEEP_ALL)

        assert set(versions(store.revisions(rid), store.conflicts.get(rid, ()), A)) == before == {s1, s2, s3}
        assert store.get(rid).body == "B's edit after the deletion"
        store.close()
        store = VaultStore.open(tmp_path / "abcdefghijkl", passphrase=PASS)  # the compacted log reads back the same
        assert [r.version for r in store.revisions(rid)] == [s1, s2, s3]
    finally:
        store.close()
