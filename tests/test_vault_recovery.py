"""Issue 13: crash recovery and disk errors never lose acknowledged records, never delete data.

Faults are injected at the real system calls (``os.fsync``, ``os.replace``, ``os.pwrite``) by
thin wrappers; the store code under test is the real one. A *crash* at a point is simulated by
copying the vault directory as it is when that call is reached (what a ``kill -9`` or a power
loss with every earlier write on disk leaves) and opening the copy.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.errors import DiskError, VaultCorrupt
from memoriesd.vault.format import (
    GROUP_END,
    HEAD_NAME,
    HEADER_NAME,
    LEN,
    Head,
    decode_full_log,
    encode_entry,
    log_name,
    next_hash,
    seal_head,
)
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import Setting, VaultStore

from .test_vault_store import CHEAP, PW, _queued_while_locked, make_vault, rec

REAL_FSYNC = os.fsync
REAL_REPLACE = os.replace
REAL_PWRITE = os.pwrite


def state(d: Path, passphrase: bytes = PW) -> dict[str, str]:
    s = VaultStore.open(d, passphrase=passphrase)
    try:
        return {r.id: r.body for r in s.latest()}
    finally:
        s.close()


def preserved(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("preserved-"))


def entries_of(raw: bytes) -> list[bytes]:
    pos, out = 0, []
    while pos < len(raw):
        (n,) = LEN.unpack_from(raw, pos)
        out.append(raw[pos : pos + LEN.size + n])
        pos += LEN.size + n
    return out


def is_dir_fd(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


def is_log_fd(fd: int, d: Path) -> bool:
    st = os.fstat(fd)
    return any(p.name.startswith("log-") and p.stat().st_ino == st.st_ino for p in d.iterdir())


class Faults:
    """Wrappers over the OS primitives: raise OSError on the Nth matching call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch

    def fail_fsync(self, match: Callable[[int], bool], nth: int = 1, err: int = errno.EIO) -> list[int]:
        calls = [0]

        def fsync(fd: int) -> None:
            if match(fd):
                calls[0] += 1
                if calls[0] == nth:
                    raise OSError(err, os.strerror(err))
            REAL_FSYNC(fd)

        self.mp.setattr(os, "fsync", fsync)
        return calls

    def fail_pwrite(self, err: int = errno.ENOSPC) -> None:
        def pwrite(fd: int, data: Any, offset: int) -> int:
            REAL_PWRITE(fd, bytes(data)[:7], offset)  # a partial write, then the error
            raise OSError(err, os.strerror(err))

        self.mp.setattr(os, "pwrite", pwrite)

    def undo(self) -> None:
        self.mp.undo()


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    f = Faults(monkeypatch)
    yield f
    f.undo()


# ----------------------------------------------------------------------------- A: the log says where writes end


def test_the_group_marker_is_ignored_by_records_and_settings() -> None:
    r = rec("body")
    entry = {**r.to_entry(), GROUP_END: 1}
    assert Record.from_entry(entry, None) == r
    tomb = Record(r.id, 2, "memory", "", "", False, (), created=r.created, updated=now(), deleted=True)
    assert Record.from_entry({**tomb.to_entry(), GROUP_END: 1}, r) == Record.from_entry(tomb.to_entry(), r)


def test_each_group_commit_marks_exactly_its_last_entry(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    s.commit([rec("a"), rec("b"), Setting("k", 1)])  # one group of 3
    _queued_while_locked(s, [[rec(f"q{i}")] for i in range(4)])  # one group of 4 batches
    s.commit([rec("c")])
    entries = decode_full_log(s._records, s.vault_id, 0, (d / log_name(0)).read_bytes())
    assert entries is not None
    assert [GROUP_END in e for e in entries] == [False, False, True, False, False, False, True, True]
    stats = s.compact(keep_revisions=4)
    assert stats["revisions_after"] == 7
    compacted = decode_full_log(s._records, s.vault_id, 1, (d / log_name(1)).read_bytes())
    assert compacted is not None and [GROUP_END in e for e in compacted] == [False] * 7 + [True]
    s.close()


def test_every_group_after_an_older_head_is_rolled_forward(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    empty_head = (d / HEAD_NAME).read_bytes()
    s.commit([rec("one"), rec("two")])
    _queued_while_locked(s, [[rec("three")], [rec("four")]])
    s.commit([Setting("policy.device_only", True)])
    r = rec("five")
    s.commit([r])
    s.commit([Record(r.id, 2, "memory", "t", "five, edited", False, (), created=r.created, updated=now())])
    want = {x.id: x.body for x in s.latest()}
    s.close()
    log_bytes = (d / log_name(0)).read_bytes()
    (d / HEAD_NAME).write_bytes(empty_head)  # the head of the empty vault, put back
    s = VaultStore.open(d, passphrase=PW)
    assert {x.id: x.body for x in s.latest()} == want
    assert s.settings == {"policy.device_only": True}
    assert [x.revision for x in s.history(r.id)] == [1, 2]
    assert s.head.log_bytes == len(log_bytes)
    s.commit([rec("six")])  # the store goes on from the recovered head
    s.close()
    assert len(state(d)) == 6
    assert preserved(d) == []


def test_a_torn_group_is_never_applied_and_its_bytes_are_kept(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 2)
    head_before = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    s.commit([rec("acknowledged one")])
    s.commit([rec("acknowledged two")])
    good_len = (d / log_name(0)).stat().st_size
    s.commit([rec("torn a"), rec("torn b"), rec("torn c")])
    s.close()
    raw = (d / log_name(0)).read_bytes()
    torn_entries = entries_of(raw[good_len:])
    assert len(torn_entries) == 3
    # Cut inside the group: at an entry boundary (two entries that authenticate, no marker) and
    # inside the last entry. Neither may apply a part of the batch.
    for cut in (good_len + len(torn_entries[0]) + len(torn_entries[1]), len(raw) - 5):
        for p in d.iterdir():
            if p.name.startswith("preserved-"):
                p.unlink()
        (d / log_name(0)).write_bytes(raw[:cut])
        (d / HEAD_NAME).write_bytes(head_before)  # and the head is an older one too
        got = state(d)
        assert sorted(got.values()) == ["acknowledged one", "acknowledged two", "body 0 CANARY", "body 1 CANARY"]
        assert (d / log_name(0)).read_bytes() == raw[:good_len]
        assert preserved(d) == [f"preserved-tail-00000000-{good_len}.bin"]
        assert (d / preserved(d)[0]).read_bytes() == raw[good_len:cut]
        assert ((d / preserved(d)[0]).stat().st_mode & 0o777) == 0o600
        assert state(d) == got and preserved(d) == [f"preserved-tail-00000000-{good_len}.bin"]


def test_a_legacy_tail_without_markers_is_kept_aside_and_legacy_logs_still_read(tmp_path: Path) -> None:
    """Logs written before group markers: the prefix the head covers reads as before; entries
    after the head cannot be split into batches, so they are moved to a preserved file."""
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    sealer, vid = s._records, s.vault_id
    prev, seq, data = s.head.last_hash, 0, b""
    legacy = [rec(f"legacy {i}") for i in range(3)]
    for r in legacy:  # unmarked entries, as the old writer made them
        framed = encode_entry(sealer, vid, 0, seq, prev, r.to_entry())
        prev, seq, data = next_hash(prev, framed[4:]), seq + 1, data + framed
    covered = len(data)
    (d / log_name(0)).write_bytes(data)
    (d / HEAD_NAME).write_bytes(seal_head(s._head_sealer, vid, Head(0, seq, covered, prev)))
    tail = b""
    for r in [rec("legacy unacknowledged")]:
        framed = encode_entry(sealer, vid, 0, seq, prev, r.to_entry())
        tail += framed
    s.close()
    assert sorted(state(d).values()) == ["legacy 0", "legacy 1", "legacy 2"]
    with open(d / log_name(0), "ab") as f:
        f.write(tail)
    assert sorted(state(d).values()) == ["legacy 0", "legacy 1", "legacy 2"]
    assert (d / log_name(0)).read_bytes() == data
    assert (d / f"preserved-tail-00000000-{covered}.bin").read_bytes() == tail


def test_an_authenticated_tail_that_does_not_apply_is_refused_not_cut(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    head = s.head
    bad = {"t": "del", "id": new_record_id(), "rev": 2, "updated": now(), GROUP_END: 1}  # unknown record
    framed = encode_entry(s._records, s.vault_id, 0, head.count, head.last_hash, bad)
    s.close()
    with open(d / log_name(0), "ab") as f:
        f.write(framed)
    with pytest.raises(VaultCorrupt):
        state(d)
    assert (d / log_name(0)).read_bytes() == framed and preserved(d) == []


# ----------------------------------------------------------------------------- A: leftover logs of other epochs


def test_an_interrupted_compactions_newer_log_is_kept_aside_not_loaded(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    rid = new_record_id()
    for i in range(1, 5):
        s.commit([rec(f"rev {i}", rid, i)])
    s.commit([rec("other"), Setting("k", "v")])
    s.close()
    before = tmp_path / "before" / d.name  # a vault directory is named by its id
    shutil.copytree(d, before)
    s = VaultStore.open(d, passphrase=PW)
    s.compact(keep_revisions=2)
    s.close()
    # The compaction's new log was written and fsynced; the crash came before its head.
    shutil.copy2(d / log_name(1), before / log_name(1))
    s = VaultStore.open(before, passphrase=PW)
    assert [r.revision for r in s.history(rid)] == [1, 2, 3, 4]
    s.close()
    # Never deleted (it cannot be told apart from a newer real log beside an older head): kept aside.
    assert sorted(p.name for p in before.iterdir()) == ["head.bin", "header.json", log_name(0), "preserved-" + log_name(1)]


def test_a_newer_log_beside_an_older_head_and_log_is_preserved_not_deleted(tmp_path: Path) -> None:
    """An older head.bin and log put back beside the real, newer log (a rollback, or a partial
    restore): the newer log holds records the old state lacks, so it is kept, never deleted."""
    d, _ = make_vault(tmp_path, 2)
    old = tmp_path / "old"
    shutil.copytree(d, old)
    s = VaultStore.open(d, passphrase=PW)
    s.compact(keep_revisions=4)
    s.commit([rec("written after the compaction")])
    s.close()
    newer = (d / log_name(1)).read_bytes()
    for name in (HEAD_NAME, log_name(0)):
        shutil.copy2(old / name, d / name)
    assert len(state(d)) == 2  # the restored old state (indistinguishable from a backup)
    assert not (d / log_name(1)).exists()
    assert (d / "preserved-log-00000001.bin").read_bytes() == newer
    s = VaultStore.open(d, passphrase=PW)  # a later compaction is not blocked by the kept file
    s.compact(keep_revisions=4)
    s.close()
    assert (d / "preserved-log-00000001.bin").read_bytes() == newer


def test_an_older_epochs_log_is_removed_and_unrelated_files_are_left(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 2)
    keep = tmp_path / "keep"
    shutil.copytree(d, keep)
    s = VaultStore.open(d, passphrase=PW)
    s.compact(keep_revisions=4)
    s.close()
    shutil.copy2(keep / log_name(0), d / log_name(0))  # the unlink after the head was lost
    (d / "preserved-tail-00000000-99.bin").write_bytes(b"kept")
    (d / "log-notes.txt").write_bytes(b"not ours")
    (d / ".head.bin.abcdef.tmp").write_bytes(b"temp")
    assert len(state(d)) == 2
    assert sorted(p.name for p in d.iterdir()) == ["head.bin", "header.json", "log-00000001.bin", "log-notes.txt", "preserved-tail-00000000-99.bin"]


# ----------------------------------------------------------------------------- B: disk errors during writes


def test_a_failed_directory_fsync_after_the_head_rename_keeps_the_log(tmp_path: Path, faults: Faults) -> None:
    """Issue 13: the head was renamed into place, then the directory fsync failed; the old code
    cut the log back under the new head and the vault read as corrupt."""
    d, recs = make_vault(tmp_path, 2)
    head_before = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    late = rec("late")
    faults.fail_fsync(is_dir_fd)
    with pytest.raises(DiskError) as ei:
        s.commit([late])
    faults.undo()
    assert ei.value.code == "io_error" and "\n" not in str(ei.value)
    assert "unknown" in str(ei.value) and "lock and unlock" in str(ei.value)
    assert s.get(late.id).body == "late"  # memory matches the log
    in_memory = {r.id: r.body for r in s.latest()}
    with pytest.raises(DiskError):  # no more writes on trust
        s.commit([rec("refused")])
    with pytest.raises(DiskError):
        s.compact(keep_revisions=4)
    s.close()
    assert state(d) == in_memory  # the new head is in place: every record is there
    # The rename did not survive (power loss): the old head is back; the fsynced group is not lost.
    (d / HEAD_NAME).write_bytes(head_before)
    assert state(d) == in_memory
    s = VaultStore.open(d, passphrase=PW)  # lock and unlock: writable again
    s.commit([rec("after")])
    s.close()
    assert len(state(d)) == len(recs) + 2


def test_a_failed_log_fsync_leaves_the_outcome_unknown_and_the_log_untouched(tmp_path: Path, faults: Faults) -> None:
    d, recs = make_vault(tmp_path, 2)
    s = VaultStore.open(d, passphrase=PW)
    maybe = rec("maybe")
    faults.fail_fsync(lambda fd: is_log_fd(fd, d))
    with pytest.raises(DiskError) as ei:
        s.commit([maybe])
    faults.undo()
    assert "unknown" in str(ei.value)
    assert maybe.id not in {r.id for r in s.latest()}  # memory keeps what is certain
    with pytest.raises(DiskError):
        s.commit([rec("refused")])
    s.close()
    got = state(d)  # old or new, never fewer, never refused
    assert {r.id for r in recs} <= set(got) <= {r.id for r in recs} | {maybe.id}


def test_a_failed_head_write_before_its_rename_keeps_the_fsynced_group(tmp_path: Path, faults: Faults) -> None:
    d, recs = make_vault(tmp_path, 2)
    s = VaultStore.open(d, passphrase=PW)
    late = rec("late")
    faults.fail_fsync(lambda fd: not is_dir_fd(fd) and not is_log_fd(fd, d))  # the head's temp file
    with pytest.raises(DiskError):
        s.commit([late])
    faults.undo()
    assert s.get(late.id).body == "late"
    s.close()
    assert set(state(d)) == {r.id for r in recs} | {late.id}
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_append_saves_nothing_and_the_store_stays_usable(tmp_path: Path, faults: Faults) -> None:
    d, recs = make_vault(tmp_path, 2)
    size = (d / log_name(0)).stat().st_size
    s = VaultStore.open(d, passphrase=PW)
    faults.fail_pwrite(errno.ENOSPC)
    with pytest.raises(DiskError) as ei:
        s.commit([rec("no room")])
    faults.undo()
    assert "nothing was saved" in str(ei.value)
    assert (d / log_name(0)).stat().st_size == size
    s.commit([rec("room again")])
    s.close()
    assert sorted(state(d).values()) == sorted([r.body for r in recs] + ["room again"])


def test_compaction_never_unlinks_its_new_log_once_its_head_is_in_place(tmp_path: Path, faults: Faults) -> None:
    d, recs = make_vault(tmp_path, 3)
    head_before = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    want = {r.id: r.body for r in s.latest()}
    faults.fail_fsync(is_dir_fd, nth=2)  # 1: after the new log; 2: the head's rename
    with pytest.raises(DiskError):
        s.compact(keep_revisions=1)
    faults.undo()
    assert s.head.epoch == 1 and {r.id: r.body for r in s.latest()} == want
    with pytest.raises(DiskError):
        s.commit([rec("refused")])
    s.close()
    assert (d / log_name(1)).exists() and (d / log_name(0)).exists()
    keep_old = tmp_path / "rename-lost" / d.name
    shutil.copytree(d, keep_old)
    assert state(d) == want  # the new head names log 1; log 0 (older) is removed
    assert not (d / log_name(0)).exists()
    (keep_old / HEAD_NAME).write_bytes(head_before)  # the rename was lost: epoch 0 again
    assert state(keep_old) == want
    assert not (keep_old / log_name(1)).exists()  # redundant with log 0, proven entry by entry


def test_compaction_failing_before_its_head_changes_nothing(tmp_path: Path, faults: Faults) -> None:
    d, _ = make_vault(tmp_path, 3)
    s = VaultStore.open(d, passphrase=PW)
    want = {r.id: r.body for r in s.latest()}
    faults.fail_fsync(is_dir_fd, nth=1)
    with pytest.raises(DiskError) as ei:
        s.compact(keep_revisions=1)
    faults.undo()
    assert "nothing changed" in str(ei.value)
    assert s.head.epoch == 0 and not (d / log_name(1)).exists()
    s.commit([rec("still writable")])
    s.close()
    assert len(state(d)) == len(want) + 1


def test_a_failed_directory_fsync_in_rewrap_keeps_memory_on_the_new_header(tmp_path: Path, faults: Faults) -> None:
    d, recs = make_vault(tmp_path, 2)
    s = VaultStore.open(d, passphrase=PW)
    old_wrap = s.header.wrap
    faults.fail_fsync(is_dir_fd)
    with pytest.raises(DiskError) as ei:
        s.rewrap(b"new pass", CHEAP)
    faults.undo()
    assert "new passphrase" in str(ei.value) and "\n" not in str(ei.value)
    assert s.header.wrap != old_wrap  # memory matches the header now in place
    assert json.loads((d / HEADER_NAME).read_text())["wrap"] == s.header.wrap
    with pytest.raises(DiskError):
        s.commit([rec("refused")])
    s.close()
    assert len(state(d, b"new pass")) == 2


# ----------------------------------------------------------------------------- C: a crash at every point


class Crashes:
    """Copy the vault directory right before each fsync / rename / unlink it makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, d: Path, out: Path) -> None:
        self.images: list[tuple[str, Path]] = []
        real_unlink = os.unlink

        def image(point: str) -> None:
            dest = out / f"{len(self.images):02d}-{point}" / d.name
            shutil.copytree(d, dest)
            self.images.append((point, dest))

        def fsync(fd: int) -> None:
            if is_dir_fd(fd):
                image("before-dir-fsync")
            elif is_log_fd(fd, d):
                image("before-log-fsync")
            else:
                image("before-file-fsync")
            REAL_FSYNC(fd)

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            image(f"before-rename-{Path(dst).name}")
            REAL_REPLACE(src, dst, **kw)

        def unlink(path: Any, **kw: Any) -> None:
            if Path(path).parent == d:
                image(f"before-unlink-{Path(path).name}")
            real_unlink(path, **kw)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "unlink", unlink)


def _opens_old_or_new(image: Path, old: dict[str, str], new: dict[str, str]) -> str:
    got = state(image)  # never a refusal to open
    assert got in (old, new), f"{image.name}: neither the old nor the new state"
    return "new" if got == new else "old"


def test_a_crash_at_every_point_of_a_group_commit_opens_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = make_vault(tmp_path, 2)
    old = state(d)
    s = VaultStore.open(d, passphrase=PW)
    size = (d / log_name(0)).stat().st_size
    batch = [rec("new a"), rec("new b"), rec("new c")]
    crashes = Crashes(monkeypatch, d, tmp_path / "images")
    s.commit(batch)
    monkeypatch.undo()
    s.close()
    new = {**old, **{r.id: r.body for r in batch}}
    points = [p for p, _ in crashes.images]
    assert points == ["before-log-fsync", "before-file-fsync", "before-rename-head.bin", "before-dir-fsync"]
    images = dict(crashes.images)
    old_head = (images["before-log-fsync"] / HEAD_NAME).read_bytes()
    raw = (images["before-log-fsync"] / log_name(0)).read_bytes()  # the whole group, not yet fsynced
    # Once the append is fsynced, the group is there even if the head never moved.
    for p in ("before-file-fsync", "before-rename-head.bin", "before-dir-fsync"):
        assert _opens_old_or_new(images[p], old, new) == "new", p
    # After the head rename and before the directory fsync, the rename may also be lost.
    lost = images["before-dir-fsync"]
    (lost / HEAD_NAME).write_bytes(old_head)
    (lost / log_name(0)).write_bytes(raw)
    assert _opens_old_or_new(lost, old, new) == "new"
    # Before the append fsync, any prefix of the appended bytes may have reached the disk: the
    # old state, or (all of it) the new one; never fewer records, never a refusal.
    image = images["before-log-fsync"]
    for cut in sorted({size, size + 1, size + 60, *range(size, len(raw), 37), len(raw) - 1, len(raw)}):
        (image / HEAD_NAME).write_bytes(old_head)
        (image / log_name(0)).write_bytes(raw[:cut])
        for p in preserved(image):
            (image / p).unlink()
        expect = "new" if cut == len(raw) else "old"
        assert _opens_old_or_new(image, old, new) == expect, cut
        if cut > size:
            assert preserved(image) == ([] if cut == len(raw) else [f"preserved-tail-00000000-{size}.bin"])


def test_a_crash_at_every_point_of_a_compaction_opens_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    rid = new_record_id()
    for i in range(1, 4):
        s.commit([rec(f"rev {i}", rid, i)])
    gone = rec("gone")
    s.commit([gone])
    s.commit([Record(gone.id, 2, "memory", "", "", False, (), created=now(), updated=now(), deleted=True)])
    s.close()
    before = state(d)
    s = VaultStore.open(d, passphrase=PW)
    crashes = Crashes(monkeypatch, d, tmp_path / "images")
    s.compact(keep_revisions=1)
    monkeypatch.undo()
    s.close()
    assert len(crashes.images) >= 5
    for _, img in crashes.images:  # latest() is the same before and after a compaction
        assert _opens_old_or_new(img, before, before) == "new"
        assert sorted(p.name for p in img.iterdir() if p.name.startswith("log-")) in ([log_name(0)], [log_name(1)])
        assert preserved(img) in ([], ["preserved-" + log_name(1)])  # a crash before the head: the new log kept aside
