"""Issue 13: the log, the head, rollback and crash recovery never lose an acknowledged record
and never repair by deleting data.

A. an older head.bin put back (or a crash between the log fsync and the head write) used to cut
   acknowledged records off the log: complete groups are now rolled forward, the bytes of an
   incomplete one moved to a ``preserved-*`` file, a newer-epoch log renamed, never deleted;
B. a failed directory fsync after the head rename used to cut the log under the new head (the
   vault then read as corrupt): the log is kept, callers get ``io_error``, writes are refused
   until lock and unlock;
C. a failure, or a crash, at every point of a group commit opens with the old or the new state.

Faults are injected only at the OS primitives (``os.fsync``, ``os.replace``, ``os.pwrite``) by
thin wrappers; the store code under test is the real one. A *crash* at a point is a copy of the
vault directory taken when that call is reached (what ``kill -9``, or a power loss with every
earlier write on disk, leaves) and opened as a vault. Module-level imports are only names that
existed before the fix, so against the old code these tests fail on their assertions.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memoriesd.errors import VaultCorrupt
from memoriesd.vault.format import HEAD_NAME, HEADER_NAME, LEN, log_name
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import Setting, VaultStore

from .test_vault_store import CHEAP, PW, _queued_while_locked, make_vault, rec

REAL_FSYNC = os.fsync
REAL_REPLACE = os.replace
REAL_PWRITE = os.pwrite
FAILURES = "unlock-failures"  # managed by the vault manager: recovery must never touch it


def state(d: Path, passphrase: bytes = PW) -> dict[str, str]:
    s = VaultStore.open(d, passphrase=passphrase)
    try:
        return {r.id: r.body for r in s.latest()}
    finally:
        s.close()


def memory(s: VaultStore) -> dict[str, str]:
    return {r.id: r.body for r in s.latest()}


def preserved(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("preserved-"))


def logs(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("log-"))


def frames(raw: bytes) -> list[bytes]:
    """The framed entries of log bytes."""
    pos, out = 0, []
    while pos < len(raw):
        (n,) = LEN.unpack_from(raw, pos)
        out.append(raw[pos : pos + LEN.size + n])
        pos += LEN.size + n
    return out


def is_dir_fd(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


def is_log_fd(fd: int, d: Path) -> bool:
    ino = os.fstat(fd).st_ino
    return any(p.name.startswith("log-") and p.stat().st_ino == ino for p in d.iterdir())


def code_of(exc: BaseException) -> str | None:
    return getattr(exc, "code", None)


def fail_fsync(mp: pytest.MonkeyPatch, match: Callable[[int], bool], nth: int = 1, err: int = errno.EIO) -> None:
    """``os.fsync`` raises ``OSError(err)`` on the ``nth`` call whose fd matches."""
    calls = [0]

    def fsync(fd: int) -> None:
        if match(fd):
            calls[0] += 1
            if calls[0] == nth:
                raise OSError(err, os.strerror(err))
        REAL_FSYNC(fd)

    mp.setattr(os, "fsync", fsync)


def with_failures_file(d: Path) -> None:
    (d / FAILURES).write_text("3\n")


def failures_file_kept(d: Path) -> bool:
    return (d / FAILURES).read_text() == "3\n"


# ----------------------------------------------------------------------------- A: rollback and torn tails


def test_a_rolled_back_head_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """The issue's case: head.bin restored to an older copy. Every acknowledged group after it
    (one batch, a group of queued batches, a setting, an update) is rolled forward; not one log
    byte is removed; a new head covers them; the store goes on writing after them."""
    d, recs = make_vault(tmp_path, 2)
    with_failures_file(d)
    old_head = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    s.commit([rec("one"), rec("two")])
    assert all(e is None for e in _queued_while_locked(s, [[rec("three")], [rec("four")]]).values())
    s.commit([Setting("policy.device_only", True)])
    five = rec("five")
    s.commit([five])
    s.commit([rec("five, edited", five.id, 2)])
    want, want_settings = memory(s), dict(s.settings)
    s.close()
    log_bytes = (d / log_name(0)).read_bytes()
    (d / HEAD_NAME).write_bytes(old_head)

    s = VaultStore.open(d, passphrase=PW)
    assert memory(s) == want and len(want) == 7
    assert s.settings == want_settings
    assert [r.revision for r in s.history(five.id)] == [1, 2]
    s.commit([rec("six")])
    s.close()
    assert (d / log_name(0)).read_bytes()[: len(log_bytes)] == log_bytes  # nothing cut
    assert (d / HEAD_NAME).read_bytes() != old_head
    assert len(state(d)) == 8
    assert preserved(d) == [] and failures_file_kept(d)


def test_every_group_commit_and_compaction_marks_its_last_entry(tmp_path: Path) -> None:
    from memoriesd.vault.format import GROUP_END, decode_full_log

    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    s.commit([rec("a"), rec("b"), Setting("k", 1)])  # one batch of 3
    _queued_while_locked(s, [[rec(f"q{i}")] for i in range(3)])  # one group of 3 batches
    s.commit([rec("c")])
    entries = decode_full_log(s._records, s.vault_id, 0, (d / log_name(0)).read_bytes())
    assert entries is not None
    assert [e.get(GROUP_END) for e in entries] == [None, None, 1, None, None, 1, 1]
    s.compact(keep_revisions=1)
    compacted = decode_full_log(s._records, s.vault_id, 1, (d / log_name(1)).read_bytes())
    assert compacted is not None and [e.get(GROUP_END) for e in compacted] == [None] * 6 + [1]
    s.close()
    # The marker is ignored by records and settings.
    r = rec("x")
    assert Record.from_entry({**r.to_entry(), GROUP_END: 1}, None) == r
    assert state(d) and VaultStore.open(d, passphrase=PW).settings == {"k": 1}


def test_a_torn_group_is_never_applied_and_its_bytes_are_preserved_not_deleted(tmp_path: Path) -> None:
    d, recs = make_vault(tmp_path, 2)
    with_failures_file(d)
    old_head = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    s.commit([rec("acknowledged one")])
    s.commit([rec("acknowledged two")])
    good = (d / log_name(0)).stat().st_size
    s.commit([rec("torn a"), rec("torn b"), rec("torn c")])  # stands for a group cut by a crash
    s.close()
    raw = (d / log_name(0)).read_bytes()
    torn = frames(raw[good:])
    want = sorted([r.body for r in recs] + ["acknowledged one", "acknowledged two"])
    # Cut at an entry boundary (two entries that authenticate, no group end) and inside an entry.
    for cut in (good + len(torn[0]) + len(torn[1]), len(raw) - 5, good + 3):
        for name in preserved(d):
            (d / name).unlink()
        (d / log_name(0)).write_bytes(raw[:cut])
        (d / HEAD_NAME).write_bytes(old_head)  # and an older head: two groups to roll forward
        assert sorted(state(d).values()) == want, cut
        assert (d / log_name(0)).read_bytes() == raw[:good]
        kept = f"preserved-tail-00000000-{good}.bin"
        assert preserved(d) == [kept]
        assert (d / kept).read_bytes() == raw[good:cut]  # the exact sealed bytes
        assert (d / kept).stat().st_mode & 0o777 == 0o600
        assert sorted(state(d).values()) == want  # a later unlock keeps the preserved file
        assert preserved(d) == [kept] and failures_file_kept(d)


def test_a_legacy_tail_without_group_marks_is_preserved_and_legacy_logs_still_read(tmp_path: Path) -> None:
    from memoriesd.vault.format import Head, encode_entry, next_hash, seal_head

    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    prev, seq, data = s.head.last_hash, 0, b""
    for i in range(3):  # unmarked entries, as the writer before issue 13 made them
        framed = encode_entry(s._records, s.vault_id, 0, seq, prev, rec(f"legacy {i}").to_entry())
        prev, seq, data = next_hash(prev, framed[4:]), seq + 1, data + framed
    (d / log_name(0)).write_bytes(data)
    (d / HEAD_NAME).write_bytes(seal_head(s._head_sealer, s.vault_id, Head(0, seq, len(data), prev)))
    tail = encode_entry(s._records, s.vault_id, 0, seq, prev, rec("legacy, after the head").to_entry())
    s.close()
    assert sorted(state(d).values()) == ["legacy 0", "legacy 1", "legacy 2"]
    with open(d / log_name(0), "ab") as f:
        f.write(tail)
    assert sorted(state(d).values()) == ["legacy 0", "legacy 1", "legacy 2"]
    assert (d / log_name(0)).read_bytes() == data
    assert (d / f"preserved-tail-00000000-{len(data)}.bin").read_bytes() == tail


def test_an_authenticated_tail_that_does_not_apply_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    from memoriesd.vault.format import GROUP_END, encode_entry

    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    bad = {"t": "del", "id": new_record_id(), "rev": 2, "updated": now(), GROUP_END: 1}  # unknown record
    framed = encode_entry(s._records, s.vault_id, 0, s.head.count, s.head.last_hash, bad)
    s.close()
    with open(d / log_name(0), "ab") as f:
        f.write(framed)
    with pytest.raises(VaultCorrupt):
        state(d)
    assert (d / log_name(0)).read_bytes() == framed and preserved(d) == []


# ----------------------------------------------------------------------------- A: logs of other epochs


def test_an_interrupted_compactions_newer_log_is_preserved_not_deleted(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    rid = new_record_id()
    for i in range(1, 4):
        s.commit([rec(f"rev {i}", rid, i)])
    s.close()
    before = tmp_path / "before" / d.name
    shutil.copytree(d, before)
    with_failures_file(before)
    s = VaultStore.open(d, passphrase=PW)
    s.compact(keep_revisions=1)
    s.close()
    newer = (d / log_name(1)).read_bytes()
    # The compaction's new log was written in full; the crash came before its head.
    (before / log_name(1)).write_bytes(newer)
    s = VaultStore.open(before, passphrase=PW)
    assert [r.revision for r in s.history(rid)] == [1, 2, 3]
    s.compact(keep_revisions=1)  # the preserved file is out of the next compaction's way
    s.close()
    assert (before / "preserved-log-00000001.bin").read_bytes() == newer
    assert logs(before) == [log_name(1)] and failures_file_kept(before)
    assert [r.body for r in VaultStore.open(before, passphrase=PW).latest()] == ["rev 3"]


def test_an_older_head_and_log_put_back_beside_a_newer_log_keep_the_newer_one(tmp_path: Path) -> None:
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
    assert len(state(d)) == 2  # the restored state loads (it cannot be told from a backup)
    assert logs(d) == [log_name(0)]
    assert (d / "preserved-log-00000001.bin").read_bytes() == newer  # the newer records are kept


def test_only_an_older_epochs_log_and_temp_files_are_removed(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 2)
    keep = tmp_path / "keep"
    shutil.copytree(d, keep)
    s = VaultStore.open(d, passphrase=PW)
    s.compact(keep_revisions=4)
    s.close()
    shutil.copy2(keep / log_name(0), d / log_name(0))  # the unlink after the new head was lost
    (d / "preserved-tail-00000000-99.bin").write_bytes(b"kept")
    (d / "log-notes.txt").write_bytes(b"not ours")
    (d / ".head.bin.abcdef.tmp").write_bytes(b"temp")
    with_failures_file(d)
    assert len(state(d)) == 2
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [FAILURES, "head.bin", "header.json", log_name(1), "log-notes.txt", "preserved-tail-00000000-99.bin"]
    )


# ----------------------------------------------------------------------------- B: disk errors


def test_a_failed_directory_fsync_after_the_head_rename_keeps_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: the new head was renamed into place, then fsync of the directory
    failed (EIO). The old code cut the log back under the new head: the vault read as corrupt."""
    d, recs = make_vault(tmp_path, 2)
    old_head = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    late = rec("late")
    fail_fsync(monkeypatch, is_dir_fd, nth=1)  # a commit's only directory fsync: the head's
    with pytest.raises(Exception) as ei:
        s.commit([late])
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error", repr(ei.value)
    message = str(ei.value)
    assert "\n" not in message and "unknown" in message and "check the disk" in message and "lock and unlock" in message
    assert s.get(late.id).body == "late"  # memory matches what is on disk
    in_memory = memory(s)
    for write in (lambda: s.commit([rec("refused")]), lambda: s.compact(keep_revisions=4), lambda: s.rewrap(b"x", CHEAP)):
        with pytest.raises(Exception) as refused:
            write()
        assert code_of(refused.value) == "io_error"
    assert memory(s) == in_memory
    s.close()
    assert state(d) == in_memory  # reopening from disk: every record memory had, no corrupt error
    (d / HEAD_NAME).write_bytes(old_head)  # and if the rename does not survive a power loss
    assert state(d) == in_memory
    s = VaultStore.open(d, passphrase=PW)  # lock and unlock: writable again
    s.commit([rec("after")])
    s.close()
    assert len(state(d)) == len(recs) + 2


def test_every_caller_of_a_group_gets_io_error_and_memory_keeps_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = make_vault(tmp_path, 1)
    s = VaultStore.open(d, passphrase=PW)
    fail_fsync(monkeypatch, is_dir_fd, nth=1)
    results = _queued_while_locked(s, [[rec(f"queued {i}")] for i in range(4)])
    monkeypatch.undo()
    assert sorted(code_of(e) for e in results.values() if e is not None) == ["io_error"] * 4
    assert len(memory(s)) == 5
    in_memory = memory(s)
    s.close()
    assert state(d) == in_memory


def test_a_failed_log_fsync_leaves_the_log_as_it_is_and_refuses_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, recs = make_vault(tmp_path, 2)
    s = VaultStore.open(d, passphrase=PW)
    maybe = rec("maybe")
    fail_fsync(monkeypatch, lambda fd: is_log_fd(fd, d))
    with pytest.raises(Exception) as ei:
        s.commit([maybe])
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error" and "unknown" in str(ei.value)
    assert maybe.id not in memory(s)  # not acknowledged: memory keeps what is certain
    with pytest.raises(Exception) as refused:
        s.commit([rec("refused")])
    assert code_of(refused.value) == "io_error"
    s.close()
    got = state(d)
    assert {r.id for r in recs} <= set(got) <= {r.id for r in recs} | {maybe.id}


def test_a_failed_append_saves_nothing_and_the_store_stays_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, recs = make_vault(tmp_path, 2)
    size = (d / log_name(0)).stat().st_size
    s = VaultStore.open(d, passphrase=PW)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        REAL_PWRITE(fd, bytes(data)[:7], offset)  # part of it reaches the file, then ENOSPC
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(Exception) as ei:
        s.commit([rec("no room")])
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error" and "nothing was saved" in str(ei.value)
    assert (d / log_name(0)).stat().st_size == size
    s.commit([rec("room again")])
    s.close()
    assert sorted(state(d).values()) == sorted([r.body for r in recs] + ["room again"])


def test_a_compaction_never_removes_its_new_log_once_its_head_is_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = make_vault(tmp_path, 3)
    old_head = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    want = memory(s)
    fail_fsync(monkeypatch, is_dir_fd, nth=2)  # 1: after the new log is created; 2: after the head rename
    with pytest.raises(Exception) as ei:
        s.compact(keep_revisions=1)
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error"
    assert s.head.epoch == 1 and memory(s) == want
    with pytest.raises(Exception) as refused:
        s.commit([rec("refused")])
    assert code_of(refused.value) == "io_error"
    s.close()
    assert logs(d) == [log_name(0), log_name(1)]
    lost = tmp_path / "rename-lost" / d.name
    shutil.copytree(d, lost)
    assert state(d) == want and logs(d) == [log_name(1)]  # the head names log 1: log 0 is redundant
    (lost / HEAD_NAME).write_bytes(old_head)  # the rename did not survive: epoch 0 again
    assert state(lost) == want
    assert logs(lost) == [log_name(0)] and preserved(lost) == ["preserved-log-00000001.bin"]


def test_a_compaction_failing_before_its_head_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = make_vault(tmp_path, 3)
    s = VaultStore.open(d, passphrase=PW)
    want = memory(s)
    fail_fsync(monkeypatch, is_dir_fd, nth=1)
    with pytest.raises(Exception) as ei:
        s.compact(keep_revisions=1)
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error" and "nothing changed" in str(ei.value)
    assert s.head.epoch == 0 and logs(d) == [log_name(0)]
    s.commit([rec("still writable")])
    s.close()
    assert len(state(d)) == len(want) + 1


def test_a_failed_directory_fsync_in_rewrap_keeps_memory_on_the_header_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = make_vault(tmp_path, 2)
    s = VaultStore.open(d, passphrase=PW)
    fail_fsync(monkeypatch, is_dir_fd, nth=1)
    with pytest.raises(Exception) as ei:
        s.rewrap(b"new pass", CHEAP)
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error" and "\n" not in str(ei.value)
    assert json.loads((d / HEADER_NAME).read_text())["wrap"] == s.header.wrap
    with pytest.raises(Exception) as refused:
        s.commit([rec("refused")])
    assert code_of(refused.value) == "io_error"
    s.close()
    assert len(state(d, b"new pass")) == 2


# ----------------------------------------------------------------------------- C: every failure point of a group commit


def _head_temp_fd(fd: int) -> bool:
    return not is_dir_fd(fd) and os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith(".head.bin.")


@pytest.mark.parametrize("point", ["before-append-fsync", "after-append-fsync-before-head-rename", "head-rename", "after-head-rename-before-dir-fsync"])
def test_a_failure_at_each_point_of_a_group_commit_reopens_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    d, recs = make_vault(tmp_path, 2)
    old = state(d)
    s = VaultStore.open(d, passphrase=PW)
    batch = [rec("new a"), rec("new b")]
    new = {**old, **{r.id: r.body for r in batch}}
    if point == "before-append-fsync":
        fail_fsync(monkeypatch, lambda fd: is_log_fd(fd, d))
    elif point == "after-append-fsync-before-head-rename":
        fail_fsync(monkeypatch, _head_temp_fd)
    elif point == "head-rename":

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "replace", replace)
    else:
        fail_fsync(monkeypatch, is_dir_fd)
    with pytest.raises(Exception) as ei:
        s.commit(batch)
    monkeypatch.undo()
    assert code_of(ei.value) == "io_error"
    shown = memory(s)
    assert shown in (old, new)
    s.close()
    got = state(d)  # never a refusal to open
    assert got in (old, new) and set(old) <= set(got)
    if point != "before-append-fsync":  # the group was fsynced in full: it is there
        assert got == new == shown
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


class Crashes:
    """Copy the vault directory at each fsync / rename / unlink, before the call runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, d: Path, out: Path) -> None:
        self.images: list[tuple[str, Path]] = []
        real_unlink = os.unlink

        def image(point: str) -> None:
            dest = out / f"{len(self.images):02d}-{point}" / d.name
            shutil.copytree(d, dest)
            self.images.append((point, dest))

        def fsync(fd: int) -> None:
            image("dir-fsync" if is_dir_fd(fd) else "log-fsync" if is_log_fd(fd, d) else "file-fsync")
            REAL_FSYNC(fd)

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            image(f"rename-{Path(dst).name}")
            REAL_REPLACE(src, dst, **kw)

        def unlink(path: Any, **kw: Any) -> None:
            if Path(path).parent == d:
                image(f"unlink-{Path(path).name}")
            real_unlink(path, **kw)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "unlink", unlink)


def test_a_crash_at_each_point_of_a_group_commit_opens_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    images = dict(crashes.images)
    assert [p for p, _ in crashes.images] == ["log-fsync", "file-fsync", "rename-head.bin", "dir-fsync"]
    old_head = (images["log-fsync"] / HEAD_NAME).read_bytes()
    raw = (images["log-fsync"] / log_name(0)).read_bytes()
    # After the append fsync (before the head's temp fsync, before its rename, before the
    # directory fsync) the whole group is on disk: it opens new even though the head never moved.
    for p in ("file-fsync", "rename-head.bin", "dir-fsync"):
        assert state(images[p]) == new, p
    # After the head rename, before the directory fsync, a power loss may undo the rename.
    lost = images["dir-fsync"]
    (lost / HEAD_NAME).write_bytes(old_head)
    (lost / log_name(0)).write_bytes(raw)
    assert state(lost) == new
    # Before the append fsync, any prefix of the appended bytes may be on disk: old, or (all of
    # it) new; never fewer records, never a refusal, the cut bytes preserved.
    image = images["log-fsync"]
    for cut in sorted({size, size + 1, size + 60, *range(size, len(raw), 41), len(raw) - 1, len(raw)}):
        (image / HEAD_NAME).write_bytes(old_head)
        (image / log_name(0)).write_bytes(raw[:cut])
        for name in preserved(image):
            (image / name).unlink()
        assert state(image) == (new if cut == len(raw) else old), cut
        if size < cut < len(raw):
            assert (image / f"preserved-tail-00000000-{size}.bin").read_bytes() == raw[size:cut]
        else:
            assert preserved(image) == []


def test_a_crash_at_each_point_of_a_compaction_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    for point, img in crashes.images:
        assert state(img) == before, point
        assert len(logs(img)) == 1, point
        # A new log the head does not name yet is kept aside, never deleted.
        assert preserved(img) in ([], ["preserved-log-00000001.bin"]), point
