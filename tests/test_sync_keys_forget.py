"""Sync across two real daemons and a folder target: passphrase and key changes propagate, forgets
reach every device and, after the compaction epoch, leave the target.

Each test: device A makes a vault and syncs it to a folder, device B joins it (``vault.join``).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, DaemonError, create_vault, running_daemon, short_tmpdir

PASS = "correct horse"


@contextlib.contextmanager
def two_devices(notes: int = 3) -> Iterator[tuple[Daemon, Daemon, str, Path, list[str]]]:
    root = short_tmpdir("sk")
    target = root / "target"
    try:
        with running_daemon() as a, running_daemon() as b:
            vid = create_vault(a, "shared", PASS)
            ids = [
                a.call("memory.add", {"vault": vid, "kind": "memory", "title": f"note {i}", "body": f"body {i} of the shared vault"})["id"]
                for i in range(notes)
            ]
            a.call("sync.add", {"vault": vid, "target": str(target)})
            a.call("sync.now", {"vault": vid})
            b.call("vault.join", {"target": str(target), "passphrase": PASS})
            yield a, b, vid, target, ids
    finally:
        shutil.rmtree(root, ignore_errors=True)


def titles(d: Daemon, vid: str) -> list[str]:
    return sorted(r["title"] for r in d.call("memory.list", {"vault": vid})["records"])


def settle(*devices: tuple[Daemon, str]) -> None:
    for _ in range(2):
        for d, vid in devices:
            d.call("sync.now", {"vault": vid})


def unlock_fails(d: Daemon, vid: str, passphrase: str) -> bool:
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": passphrase})
    except DaemonError as exc:
        assert exc.code == "bad_passphrase"
        return True
    return False


def test_a_passphrase_change_on_one_device_becomes_the_passphrase_of_the_other() -> None:
    with two_devices() as (a, b, vid, _target, _ids):
        a.call("vault.passwd", {"vault": vid, "old": PASS, "new": "battery staple"})
        settle((a, vid), (b, vid))
        b.call("vault.lock", {"vault": vid})
        assert unlock_fails(b, vid, PASS)
        assert not unlock_fails(b, vid, "battery staple")
        assert titles(b, vid) == titles(a, vid)


def test_a_key_change_rewrites_the_target_and_the_other_device_adopts_it_keeping_its_own_writes() -> None:
    with two_devices() as (a, b, vid, target, _ids):
        before = {p.name for p in target.iterdir()}
        out = a.call("vault.passwd", {"vault": vid, "old": PASS, "new": "a new key phrase", "rekey": True})
        assert out["rekeyed"] and out["sync_targets"] == 1
        a.call("memory.add", {"vault": vid, "kind": "memory", "title": "after the key change", "body": "new key text"})
        a.call("sync.now", {"vault": vid})
        after = {p.name for p in target.iterdir()}
        assert not (before - {"memories-sync.json"}) & after, "a file sealed under the old key is still on the target"
        # B still has the old key: it refuses the target and says what to do
        b.call("memory.add", {"vault": vid, "kind": "memory", "title": "written on B meanwhile", "body": "offline text"})
        res = b.call("sync.now", {"vault": vid})
        assert "adopt-key" in res["results"]["t1"]["error"]
        with pytest.raises(DaemonError) as wrong:
            b.call("sync.adopt_key", {"vault": vid, "passphrase": "not it"})
        assert wrong.value.code == "bad_passphrase"
        b.call("sync.adopt_key", {"vault": vid, "passphrase": "a new key phrase"})
        settle((b, vid), (a, vid))
        assert titles(a, vid) == titles(b, vid)
        assert "written on B meanwhile" in titles(a, vid) and "after the key change" in titles(b, vid)
        b.call("vault.lock", {"vault": vid})
        assert unlock_fails(b, vid, PASS)
        assert not unlock_fails(b, vid, "a new key phrase")


def _forget(d: Daemon, vid: str, rid: str) -> dict[str, Any]:
    return d.call("memory.forget", {"vault": vid, "ids": [rid]})


def test_a_forget_reaches_every_device_and_leaves_the_target_at_the_compaction_epoch() -> None:
    with two_devices() as (a, b, vid, target, ids):
        secret = ids[1]
        before = {p.name: p.read_bytes() for p in target.iterdir() if p.name != "memories-sync.json"}
        _forget(a, vid, secret)
        a.call("sync.now", {"vault": vid})
        b.call("sync.now", {"vault": vid})
        with pytest.raises(DaemonError) as gone:
            b.call("memory.read", {"vault": vid, "id": secret})
        assert gone.value.code == "not_found"
        assert "note 1" not in titles(b, vid)
        # B's tip now acknowledges the forget: A's next cycle compacts the target by itself
        a.call("sync.now", {"vault": vid})
        status = a.call("sync.status", {"vault": vid})
        assert status["targets"][0]["epoch"] == 1
        settle((b, vid), (a, vid))
        assert titles(a, vid) == titles(b, vid) == ["note 0", "note 2"]
        # every file of the old epoch is gone (segments never change; tips are rewritten in the new one)
        survivors = [p.name for p in target.iterdir() if before.get(p.name) == p.read_bytes()]
        assert survivors == [], "a file from before the forget is still on the target"
        # a version of the forgotten record that comes back (an old copy of a device) is refused
        b.call("memory.add", {"vault": vid, "kind": "memory", "title": "still here", "body": "after the epoch"})
        settle((b, vid), (a, vid))
        assert titles(a, vid) == titles(b, vid) == ["note 0", "note 2", "still here"]


def test_compact_without_every_acknowledgement_is_refused_unless_forced() -> None:
    with two_devices() as (a, b, vid, _target, ids):
        b.call("sync.remove", {"vault": vid, "target": "t1"})  # B stops syncing: it never acknowledges
        _forget(a, vid, ids[0])
        a.call("sync.now", {"vault": vid})
        with pytest.raises(DaemonError) as refused:
            a.call("sync.compact", {"vault": vid})
        assert refused.value.code == "usage" and "--force" in refused.value.message
        out = a.call("sync.compact", {"vault": vid, "force": True})
        assert out["epoch"] == 1 and out["files_removed"] >= 1


def test_a_lost_sync_state_neither_loses_writes_nor_makes_conflicts() -> None:
    """Notes written before the vault first synced have derived stamps: after sync-state.bin is lost
    (and the target added again) they keep them, so no device sees a second, concurrent copy."""
    with two_devices(notes=4) as (a, b, vid, target, _ids):
        a.call("memory.add", {"vault": vid, "kind": "memory", "title": "not pushed yet", "body": "only on A"})
        a.call("vault.lock", {"vault": vid})
        (a.home / "vaults" / vid / "sync-state.bin").unlink()
        a.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert a.call("sync.status", {"vault": vid})["targets"] == []
        a.call("sync.add", {"vault": vid, "target": str(target)})
        settle((a, vid), (b, vid))
        assert titles(a, vid) == titles(b, vid)
        assert "not pushed yet" in titles(b, vid)
        for d in (a, b):
            assert d.call("sync.status", {"vault": vid})["conflicts"] == []
