"""A home copied to another machine while both copies keep syncing (issue 30, item 5: "a device
never accepts a history that forks its own").

Device A's home is copied while its daemon is stopped; both copies run with one device id and write
to one folder target. The copy whose chain the target shows ahead of it, or whose file the sync tool
overwrote with the other copy's, takes a new device id and publishes everything it holds again: both
keep every note, and a third device that joins sees each note once, with the same history.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, create_vault, running_daemon, short_tmpdir, write_config
from .test_sync_tamper import MAGIC, PASS, Device, put


def history(d: Daemon, vault: str, ids: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Each record's revisions as ``memory history`` shows them (number, title, deleted)."""
    out = {}
    for rid in ids:
        revs = d.call("memory.history", {"vault": vault, "id": rid})["revisions"]
        out[rid] = [(r["revision"], r["title"], r["deleted"]) for r in revs]
    return out


@dataclass
class CopiedHome:
    """Device A's home, synced with ``target``, copied while its daemon was stopped to home C."""

    root: Path
    target: Path
    vault: str
    device: str  # A's device id, which the copy starts with
    notes: dict[str, tuple[str, str]]  # every note written on either side
    running: dict[str, Daemon] = field(default_factory=dict)

    def start(self, who: str) -> Device:
        d = self.running[who] = Daemon(self.root / who / "h").start()
        d.call("vault.unlock", {"vault": self.vault, "passphrase": PASS})
        return Device(d, self.vault, self.target)

    def stop(self, who: str) -> None:
        self.running.pop(who).stop()

    def write(self, dev: Device, title: str, body: str) -> None:
        self.notes[dev.add(title, body)] = (title, body)

    def target_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.target.iterdir() if p.is_file()}

    def assert_converged(self, *devs: Device) -> None:
        """Every note on each device, the same history everywhere, and a third device that joins
        sees the same: nothing lost, nothing twice, no conflict, no stuck chain."""
        for dev in (*devs, *devs):
            dev.now()
        for dev in devs:
            assert dev.records() == self.notes
            assert history(dev.d, self.vault, self.notes) == history(devs[0].d, self.vault, self.notes)
            st = dev.status()
            assert st["pending"] == 0 and st["error"] is None
            assert all("history on the target forked" not in p for p in st["problems"]), st
            assert dev.d.call("sync.status", {"vault": self.vault})["conflicts"] == []
        with running_daemon() as db:
            db.call("vault.join", {"target": str(self.target), "passphrase": PASS})
            b = Device(db, self.vault, self.target)
            assert b.records() == self.notes
            assert history(db, self.vault, self.notes) == history(devs[0].d, self.vault, self.notes)
            assert (
                b.status()["problems"] == []
                and db.call("sync.status", {"vault": self.vault})["conflicts"] == []
            )


@pytest.fixture
def copied() -> Iterator[CopiedHome]:
    """A vault with a note from before it synced and one after, then A's home copied to C."""
    root = short_tmpdir("sy")
    write_config(root / "a" / "h")
    h = CopiedHome(root, root / "t", "", "", {})
    try:
        d = h.running["a"] = Daemon(root / "a" / "h").start()
        h.vault = create_vault(d, "notes", PASS)
        a = Device(d, h.vault, h.target)
        h.write(a, "Unsynced", "written before the vault synced")
        d.call("sync.add", {"vault": h.vault, "target": str(h.target)})
        h.write(a, "Seed", "before the copy")
        a.now()
        h.device = d.call("sync.status", {"vault": h.vault})["device"]
        h.stop("a")
        shutil.copytree(root / "a" / "h", root / "c" / "h", symlinks=True)
        yield h
    finally:
        for d in h.running.values():
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_copied_home_finds_its_chain_ahead_and_continues_as_a_new_device(copied: CopiedHome) -> None:
    """C writes while the target is out of its reach (its note carries A's device id); back online
    it finds its own chain ahead of it, takes a new device id and publishes again."""
    h = copied
    a = h.start("a")
    h.write(a, "On A", "written on the original")
    a.now()
    away = h.target.with_name("offline")
    h.target.rename(away)
    c = h.start("c")
    h.write(c, "On C", "written on the copy")
    assert "error" in c.now()
    away.rename(h.target)
    c.now()
    st = c.d.call("sync.status", {"vault": h.vault})
    assert st["device"] != h.device
    (problem,) = st["targets"][0]["problems"]
    assert "new device" in problem and "\n" not in problem
    a.now()
    unsynced = next(iter(h.notes))  # an edit made from the revision older than sync: no conflict
    c.d.call("memory.update", {"vault": h.vault, "id": unsynced, "body": "edited on the copy"})
    h.notes[unsynced] = ("Unsynced", "edited on the copy")
    h.assert_converged(a, c)
    assert a.d.call("sync.status", {"vault": h.vault})["device"] == h.device


@pytest.mark.parametrize(("segment_from", "tip_from"), [("a", "a"), ("a", "c"), ("c", "a"), ("c", "c")])
def test_copies_that_wrote_the_same_segment_both_keep_their_notes(
    copied: CopiedHome, segment_from: str, tip_from: str
) -> None:
    """Both copies write segment 2 before either sees the other's, and the sync tool keeps one file
    of each name (the last written wins): whichever copy's file was overwritten notices, and
    everything it wrote is published again under a new device id."""
    h = copied
    before = h.target_files()
    a = h.start("a")
    h.write(a, "On A", "written on the original")
    a.now()
    h.stop("a")
    from_a = {n: b for n, b in h.target_files().items() if before.get(n) != b}
    for name, data in before.items():  # C's machine has not received A's files yet
        put(h.target / name, data)
    for name in set(from_a) - set(before):
        (h.target / name).unlink()
    c = h.start("c")
    h.write(c, "On C", "written on the copy")
    c.now()
    h.stop("c")
    from_c = {n: b for n, b in h.target_files().items() if before.get(n) != b}
    assert set(from_a) == set(from_c)  # the same names: segment 2 and the tip
    for name, data in from_a.items():  # the sync tool keeps one of the two files of each name
        kind = data[len(MAGIC) : len(MAGIC) + 1]
        winner = segment_from if kind == b"s" else tip_from
        put(h.target / name, data if winner == "a" else from_c[name])
    a, c = h.start("a"), h.start("c")
    h.assert_converged(a, c)
    devices = {dev.d.call("sync.status", {"vault": h.vault})["device"] for dev in (a, c)}
    assert len(devices) == 2
