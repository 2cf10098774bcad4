"""Minimal reproductions of what the daemon-level convergence test (tests/test_sync_devices.py) found,
each on a real vault store (sealed log on disk, cheap Argon2id) with the versions written directly.
"""

from __future__ import annotations

from pathlib import Path

from memoriesd.memory.forget import KEEP_ALL
from memoriesd.vault.keywrap import KdfParams
from memoriesd.vault.records import Record, now
from memoriesd.vault.store import VaultStore
from memoriesd.vault.versions import heads, versions

PASS = b"correct horse"
CHEAP = KdfParams(memory_kib=64, iterations=1, lanes=1)
A, B = "a" * 16, "b" * 16


def _stamp(hlc: int, device: str) -> str:
    return f"{hlc:016x}-{device}"


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
        store.commit(
            [
                Record(
                    rid,
                    3,
                    "memory",
                    "",
                    "",
                    False,
                    (),
                    created=tomb.created,
                    updated=now(),
                    deleted=True,
                    version=s4,
                    parents=(s3,),
                )
            ]
        )
        assert _heads(store, rid) == [s4]  # one head: the deletion, made after every other version

        store.compact(KEEP_ALL)

        assert store.revisions(rid)[-1].deleted
        assert _heads(store, rid) == [s4], "a compaction made a resolved version a head again"
    finally:
        store.close()
