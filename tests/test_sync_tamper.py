"""Trust no transport (issue 30, item 5): a target that drops, reorders, duplicates, truncates,
replays or mixes files never makes a device show a wrong record or lose a local one.

Two real daemons on two homes are two devices of one vault. Device A publishes to its own folder
target ``ta``; device B syncs with another folder, ``tb``, and the test is the transport between
them: it copies A's files into ``tb`` (or not, or in another order, or damaged), as a sync tool or
a person with write access to the folder could. A target file is ``MAGIC || kind || sealed``, so
the test tells segments from tips by the kind byte, and A's segments apart by the order in which
they appear (one ``sync.now`` per note: one segment). After each tampering the test runs
``sync.now`` on B and checks what B shows against what A acknowledged.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, create_vault, running_daemon, short_tmpdir

PASS = "correct horse"
HEADER = "memories-sync.json"
MAGIC = b"MEMSYNC1"


def kind_of(path: Path) -> str:
    """The kind byte of a target file: ``s`` segment, ``t`` tip, ``e`` epoch marker."""
    with path.open("rb") as f:
        return f.read(len(MAGIC) + 1)[len(MAGIC) :].decode("ascii", "replace")


def sync_files(folder: Path, kind: str) -> set[str]:
    return {p.name for p in folder.iterdir() if len(p.name) == 32 and p.is_file() and kind_of(p) == kind}


@dataclass
class Device:
    """One daemon as one device of the vault, with the folder it syncs with."""

    d: Daemon
    vault: str
    target: Path

    def add(self, title: str, body: str) -> str:
        return str(self.d.call("memory.add", {"vault": self.vault, "title": title, "body": body})["id"])

    def now(self) -> dict[str, Any]:
        """One pull and push, waited for; its result for the (only) target."""
        out = self.d.call("sync.now", {"vault": self.vault})
        return dict(next(iter(out["results"].values())))

    def status(self) -> dict[str, Any]:
        return dict(self.d.call("sync.status", {"vault": self.vault})["targets"][0])

    def problems(self) -> str:
        return " | ".join(self.status()["problems"])

    def records(self) -> dict[str, tuple[str, str]]:
        """Every record shown: id -> (title, body), read one by one as a user would."""
        out = {}
        for r in self.d.call("memory.list", {"vault": self.vault})["records"]:
            full = self.d.call("memory.read", {"vault": self.vault, "id": r["id"]})
            out[r["id"]] = (full["title"], full["body"])
        return out


@dataclass
class Pair:
    """Device A (``ta``) and device B (``tb``); ``acked``: every note A wrote and published, and
    ``segs``: A's segment file names in chain order (``segs[0]`` is seq 1)."""

    a: Device
    b: Device
    acked: dict[str, tuple[str, str]] = field(default_factory=dict)
    segs: list[str] = field(default_factory=list)
    tips: list[bytes] = field(default_factory=list)  # A's tip as it was after each write
    local_b: dict[str, tuple[str, str]] = field(default_factory=dict)
    carried: set[str] = field(default_factory=set)  # names of A's files put into B's folder

    @property
    def ta(self) -> Path:
        return self.a.target

    @property
    def tb(self) -> Path:
        return self.b.target

    def write_a(self, title: str, body: str) -> str:
        """A note on A, published: returns the name of the one segment that holds it."""
        before = sync_files(self.ta, "s")
        rid = self.a.add(title, body)
        self.a.now()
        (new,) = sync_files(self.ta, "s") - before  # sync.now (or a cycle just before it) published it
        self.acked[rid] = (title, body)
        self.segs.append(new)
        self.tips.append((self.ta / self.tip_a()).read_bytes())
        return self.segs[-1]

    def edit_a(self, rid: str, body: str) -> str:
        """An edit of A's note ``rid``, published: returns the name of its segment."""
        before = sync_files(self.ta, "s")
        self.a.d.call("memory.update", {"vault": self.a.vault, "id": rid, "body": body})
        self.a.now()
        (new,) = sync_files(self.ta, "s") - before
        self.acked[rid] = (self.acked[rid][0], body)
        self.segs.append(new)
        self.tips.append((self.ta / self.tip_a()).read_bytes())
        return new

    def write_b(self, title: str, body: str) -> str:
        rid = self.b.add(title, body)
        self.local_b[rid] = (title, body)
        return rid

    def tip_a(self) -> str:
        (tip,) = sync_files(self.ta, "t")
        return tip

    def carry(self, *names: str, data: bytes | None = None, as_name: str | None = None) -> None:
        """Put A's file ``names`` into B's folder (``data``: these bytes instead; ``as_name``: under that name)."""
        self.carried.update(names)
        for name in names:
            body = (self.ta / name).read_bytes() if data is None else data
            put(self.tb / (as_name or name), body)

    def mirror(self) -> None:
        """Bring B's folder up to date with A's, as a sync tool does: A's files copied, the files A
        removed removed (B's own files stay)."""
        gone = {n for n in self.carried if not (self.ta / n).exists()}
        for name in gone:
            (self.tb / name).unlink(missing_ok=True)
        self.carried -= gone
        self.carry(*(p.name for p in self.ta.iterdir() if p.is_file()))

    def carry_tip(self) -> bytes:
        tip = self.tip_a()
        self.carry(tip)
        return (self.ta / tip).read_bytes()

    def ids_of(self, *indexes: int) -> dict[str, tuple[str, str]]:
        """A's acknowledged notes by the order A wrote them (0: the note B joined with)."""
        items = list(self.acked.items())
        return dict(items[i] for i in indexes)

    def assert_b_shows(self, *indexes: int) -> None:
        """B shows exactly these of A's notes, word for word, and every note written on B."""
        assert self.b.records() == {**self.ids_of(*indexes), **self.local_b}


def put(path: Path, data: bytes) -> None:
    """Write a file as a sync tool would finish one: whole, then renamed into place."""
    tmp = path.with_name(path.name + ".tamper")
    tmp.write_bytes(data)
    tmp.replace(path)


def synced_vault(d: Daemon, target: Path, name: str) -> Device:
    """A new vault on ``d`` that syncs with the folder ``target``."""
    vid = create_vault(d, name, PASS)
    d.call("sync.add", {"vault": vid, "target": str(target)})
    return Device(d, vid, target)


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A with one note published to ``ta``; B joined from ``tb`` holding A's header, segment and tip."""
    root = short_tmpdir("sy")
    ta, tb = root / "ta", root / "tb"
    tb.mkdir()
    try:
        with running_daemon() as da, running_daemon() as db:
            a = synced_vault(da, ta, "notes")
            p = Pair(a, Device(db, a.vault, tb))
            p.write_a("Seed", "the note B joins with")
            p.carry(HEADER, p.segs[0], p.tip_a())
            joined = db.call("vault.join", {"target": str(tb), "passphrase": PASS})
            assert joined["vault_id"] == a.vault and joined["records"] == 1
            p.write_b("Local", "written on B, never on A")
            p.b.now()
            p.assert_b_shows(0)
            yield p
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------- dropped, reordered


def seen_of_a(pair: Pair) -> dict[str, Any]:
    """What B's status says of device A: applied (its segments applied here) and published (its tip)."""
    (dev,) = pair.b.status()["devices"]
    return dev


def test_dropped_segment_holds_back_later_ones_until_it_comes_back(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    s3 = pair.write_a("Three", "third")
    pair.carry(s2, s3)
    (pair.tb / s2).unlink()  # the target lost seq 2 before B pulled
    pair.carry_tip()
    pair.b.now()
    pair.assert_b_shows(0)  # seq 3 waits for seq 2: nothing skipped, nothing wrong
    (problem,) = pair.b.status()["problems"]
    assert "missing from the target" in problem
    assert (seen_of_a(pair)["applied"], seen_of_a(pair)["published"]) == (1, 3)
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)
    assert seen_of_a(pair)["applied"] == 3 and pair.b.status()["problems"] == []


def test_device_that_joins_before_the_first_segment_arrives_waits_for_it(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    tc = pair.tb.with_name("tc")
    tc.mkdir()
    for name in (HEADER, s2, pair.tip_a()):
        put(tc / name, (pair.ta / name).read_bytes())
    with running_daemon() as dc:
        dc.call("vault.join", {"target": str(tc), "passphrase": PASS})
        c = Device(dc, pair.a.vault, tc)
        c.now()
        assert c.records() == {}
        (problem,) = c.status()["problems"]
        assert "missing from the target" in problem  # a gap, not a fork
        put(tc / pair.segs[0], (pair.ta / pair.segs[0]).read_bytes())
        c.now()
        assert c.records() == pair.ids_of(0, 1) and c.status()["problems"] == []


def test_reordered_segments_are_applied_in_chain_order(pair: Pair) -> None:
    s2, s3, s4 = (pair.write_a(f"N{i}", f"body {i}") for i in (2, 3, 4))
    pair.carry(s4)
    pair.b.now()
    pair.assert_b_shows(0)
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1)  # seq 2 applies, seq 4 still waits for seq 3
    pair.carry(s3)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2, 3)


def test_duplicated_segment_is_applied_once(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    pair.carry(s2)
    pair.b.now()
    received = pair.b.status()["received"]
    pair.carry(s2)  # the same bytes under the same name again
    pair.carry(s2, as_name="0123456789abcdef0123456789abcdef")  # and under another name
    pair.carry(pair.segs[0], as_name="fedcba9876543210fedcba9876543210")
    out = pair.b.now()
    assert out["received"] == 0 and pair.b.status()["received"] == received
    pair.assert_b_shows(0, 1)
    s3 = pair.write_a("Three", "third")
    pair.carry(s3)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)


def test_half_written_segment_waits_until_it_is_whole(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    s3 = pair.write_a("Three", "third")
    whole = (pair.ta / s2).read_bytes()
    pair.carry(s2, data=whole[: len(whole) // 2])
    pair.carry(s3)
    pair.b.now()
    pair.assert_b_shows(0)
    pair.carry(s2, data=whole[:-1])  # all but the last byte
    pair.b.now()
    pair.assert_b_shows(0)
    # Still arriving: not reported as damaged (for a minute); seq 3 waits for it.
    assert "do not open" not in pair.b.problems() and "missing" in pair.b.problems()
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)


# ---------------------------------------------------------------------------- replayed, rolled back


def test_old_segment_replayed_after_newer_ones_changes_nothing(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    rid = list(pair.acked)[-1]
    s3 = pair.edit_a(rid, "second, edited")
    pair.carry(s2, s3)
    pair.b.now()
    pair.assert_b_shows(0, 1)
    assert pair.b.records()[rid][1] == "second, edited"
    received = pair.b.status()["received"]
    (pair.tb / s2).unlink()
    pair.carry(pair.segs[0])  # seq 1 again, then seq 2 restored after seq 3
    pair.carry(s2)
    pair.carry(s3, data=(pair.ta / s2).read_bytes())  # and seq 2's bytes under seq 3's name
    pair.b.now()
    pair.assert_b_shows(0, 1)  # still the edit: the older version did not come back
    assert pair.b.status()["received"] == received


def test_rolled_back_chain_is_reported_and_nothing_is_lost(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    s3 = pair.write_a("Three", "third")
    pair.carry(s2, s3)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)
    assert pair.b.status()["problems"] == []  # a tip behind the segments is still on its way: no rollback
    current = pair.carry_tip()
    pair.b.now()
    # The target goes back to how it was after seq 1: later segments gone, the old tip put back.
    (pair.tb / s2).unlink()
    (pair.tb / s3).unlink()
    pair.carry(pair.tip_a(), data=pair.tips[0])
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)
    (problem,) = pair.b.status()["problems"]
    assert "rolled back" in problem and "\n" not in problem
    pair.carry(pair.tip_a(), data=current)  # the target is whole again
    pair.carry(s2, s3)
    pair.b.now()
    assert pair.b.status()["problems"] == []
    pair.assert_b_shows(0, 1, 2)


def test_replayed_segment_of_a_forgotten_note_does_not_bring_it_back(pair: Pair) -> None:
    """A note forgotten on A, the target compacted (its segment removed), then the old segment put
    back: B does not show it again, nor does a device that joins from that folder."""
    s2 = pair.write_a("Secret", "forget me everywhere")
    secret = list(pair.acked)[-1]
    pair.mirror()
    pair.b.now()
    pair.assert_b_shows(0, 1)
    old = (pair.ta / s2).read_bytes()
    pair.a.d.call("memory.forget", {"vault": pair.a.vault, "ids": [secret]})
    pair.a.now()
    del pair.acked[secret]
    pair.a.d.call("sync.compact", {"vault": pair.a.vault, "force": True})
    assert not (pair.ta / s2).exists()
    pair.mirror()
    pair.b.now()
    pair.assert_b_shows(0)
    put(pair.tb / s2, old)  # the forgotten note's segment replayed
    pair.b.now()
    pair.assert_b_shows(0)
    with running_daemon() as dc:
        dc.call("vault.join", {"target": str(pair.tb), "passphrase": PASS})
        c = Device(dc, pair.a.vault, pair.tb)
        c.now()
        assert secret not in c.records()
        assert c.records() == {**pair.ids_of(0), **pair.local_b}


def test_file_too_large_for_a_sync_file_is_not_read_and_is_reported(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    with (pair.tb / s2).open("wb") as f:  # sparse: 65 MiB that take no room
        f.truncate(65 << 20)
    pair.b.now()
    pair.assert_b_shows(0)
    (problem,) = pair.b.status()["problems"]
    assert "larger than any sync file" in problem
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1)
    assert pair.b.status()["problems"] == []


def test_own_segment_gone_from_the_target_is_reported_and_compaction_writes_it_again(pair: Pair) -> None:
    """B's own segment deleted (or the target restored from before it): B says so, other devices
    cannot get that note meanwhile, and a compaction writes everything again."""
    (own,) = sync_files(pair.tb, "s") - set(pair.carried)
    (pair.tb / own).unlink()
    pair.b.now()
    (problem,) = pair.b.status()["problems"]
    assert "gone from the target" in problem and "sync compact" in problem
    pair.assert_b_shows(0)  # B keeps its note
    pair.b.d.call("sync.compact", {"vault": pair.b.vault, "force": True})
    pair.b.now()
    assert pair.b.status()["problems"] == []
    with running_daemon() as dc:
        dc.call("vault.join", {"target": str(pair.tb), "passphrase": PASS})
        c = Device(dc, pair.a.vault, pair.tb)
        assert c.records() == {**pair.ids_of(0), **pair.local_b}


# ---------------------------------------------------------------------------- mixed vaults, mixed devices


def other_vault(pair: Pair) -> Device:
    """Another vault on A's daemon, with one note published to its own folder ``tx``."""
    other = synced_vault(pair.a.d, pair.ta.parent / "tx", "other")
    other.add("Other", "a note of another vault")
    other.now()
    return other


def test_files_of_another_vault_are_never_applied(pair: Pair) -> None:
    other = other_vault(pair)
    (x_seg,) = sync_files(other.target, "s")
    (x_tip,) = sync_files(other.target, "t")
    s2 = pair.write_a("Two", "second")
    x_seg_bytes = (other.target / x_seg).read_bytes()
    pair.carry(x_seg, data=x_seg_bytes)  # under its own name
    pair.carry(x_tip, data=(other.target / x_tip).read_bytes())
    # and under the name B expects next of A
    pair.carry(s2, data=x_seg_bytes)
    pair.b.now()
    pair.assert_b_shows(0)
    (problem,) = pair.b.status()["problems"]
    assert "3 file(s) on the target do not open" in problem
    # no device of vault X
    assert [d["device"] for d in pair.b.status()["devices"]] == [seen_of_a(pair)["device"]]
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1)
    (problem,) = pair.b.status()["problems"]
    assert "2 file(s) on the target do not open" in problem


def test_file_of_one_device_under_another_devices_name_is_never_applied(pair: Pair) -> None:
    """A reads B's chain: A's own segment put under the name of B's next segment is refused."""
    b_before = sync_files(pair.tb, "s")
    pair.write_b("Local two", "B's second note")
    pair.b.now()
    (b2,) = sync_files(pair.tb, "s") - b_before
    (b1,) = b_before - set(pair.segs)
    s2 = pair.write_a("Two", "second")
    put(pair.ta / b1, (pair.tb / b1).read_bytes())
    put(pair.ta / b2, (pair.ta / s2).read_bytes())  # device A's file under the name of B's seq 2
    pair.a.now()
    a_shows = pair.a.records()
    assert a_shows == {**pair.acked, **dict(list(pair.local_b.items())[:1])}
    put(pair.ta / b2, (pair.tb / b2).read_bytes())
    pair.a.now()
    assert pair.a.records() == {**pair.acked, **pair.local_b}


# ---------------------------------------------------------------------------- what sync tools leave behind


def test_sync_tool_temporary_and_conflict_files_are_ignored_and_conflict_copies_reported(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    whole = (pair.ta / s2).read_bytes()
    half = whole[: len(whole) // 2]
    strays = {
        f".syncthing.{s2}.tmp": half,  # Syncthing, receiving
        f"~syncthing~{s2}.tmp": half,  # Syncthing on Windows
        f"{s2}.partial": half,  # rclone / Dropbox-style partial download
        f".~{s2}.part": half,
        f"{s2}.sync-conflict-20261205-101010-ABCDEFG": whole,  # Syncthing's conflict copy
        f"{s2} (Ada's conflicted copy 2026-12-05)": whole,  # Dropbox's
    }
    for name, data in strays.items():
        put(pair.tb / name, data)
    pair.b.now()
    pair.assert_b_shows(0)
    problems = pair.b.status()["problems"]
    assert len(problems) == 1 and "2 conflict copies" in problems[0], problems
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1)
    (pair.tb / f"{s2}.sync-conflict-20261205-101010-ABCDEFG").unlink()
    (pair.tb / f"{s2} (Ada's conflicted copy 2026-12-05)").unlink()
    pair.b.now()
    assert pair.b.status()["problems"] == []


# ---------------------------------------------------------------------------- damaged bytes


def test_segment_with_a_flipped_bit_is_never_applied(pair: Pair) -> None:
    s2 = pair.write_a("Two", "second")
    s3 = pair.write_a("Three", "third")
    whole = (pair.ta / s2).read_bytes()
    for at in (len(MAGIC), len(MAGIC) + 1, len(whole) // 2, len(whole) - 1):  # kind, nonce, body, tag
        flipped = bytearray(whole)
        flipped[at] ^= 0x01
        pair.carry(s2, data=bytes(flipped))
        pair.carry(s3)
        pair.b.now()
        pair.assert_b_shows(0)
        # Whole in size but not authentic: damaged, not arriving, so reported at once.
        assert "1 file(s) on the target do not open" in pair.b.problems()
    pair.carry(s2)
    pair.b.now()
    pair.assert_b_shows(0, 1, 2)
    assert pair.b.status()["problems"] == []


def test_header_of_another_vault_stops_sync_with_one_line(pair: Pair) -> None:
    other = other_vault(pair)
    mine = (pair.tb / HEADER).read_bytes()
    s2 = pair.write_a("Two", "second")
    pair.carry(s2)
    put(pair.tb / HEADER, (other.target / HEADER).read_bytes())
    out = pair.b.now()
    assert "another vault" in out["error"] or "not this vault" in out["error"], out
    assert "\\n" not in out["error"] and pair.b.status()["error"] == out["error"]
    pair.assert_b_shows(0)
    assert (pair.tb / HEADER).read_bytes() == (other.target / HEADER).read_bytes()  # B did not overwrite it
    put(pair.tb / HEADER, mine)
    assert "error" not in pair.b.now()
    pair.assert_b_shows(0, 1)
    assert pair.b.status()["error"] is None and pair.b.status()["problems"] == []


@pytest.mark.parametrize("damage", ["truncated", "not json", "empty"])
def test_damaged_header_stops_sync_with_one_line(pair: Pair, damage: str) -> None:
    mine = (pair.tb / HEADER).read_bytes()
    s2 = pair.write_a("Two", "second")
    pair.carry(s2)
    bad = {"truncated": mine[: len(mine) // 2], "not json": b"<html>502 Bad Gateway</html>", "empty": b""}[
        damage
    ]
    put(pair.tb / HEADER, bad)
    out = pair.b.now()
    assert "memories-sync.json" in out["error"] and "\\n" not in out["error"], out
    pair.assert_b_shows(0)
    assert (pair.tb / HEADER).read_bytes() == bad
    put(pair.tb / HEADER, mine)
    pair.b.now()
    pair.assert_b_shows(0, 1)
    assert pair.b.status()["error"] is None and pair.b.status()["problems"] == []
