"""Two homes, two daemons, one vault: synced through real sync engines on 127.0.0.1 — an rclone WebDAV
remote (``rclone serve webdav``) and two real Syncthing instances carrying a folder target. A vault
made on one device is joined on the other with the passphrase, and an edit on either side arrives on
the other. (The transports' own contract is tests/test_sync_transport.py; convergence under faults
belongs to the engine's tests.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon, DaemonError, create_vault, short_tmpdir, write_config
from tests.support import rclone_serve
from tests.support.syncthing import DEADLINE, SYNCTHING_MISSING, SyncthingPair, syncthing_program

PASSPHRASE = "correct horse"


def _eventually(probe: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """``probe()``'s first truthy result; a ``sync_target`` error (the file has not arrived yet) is
    another try. TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = probe()
            if got:
                return got
        except DaemonError as exc:
            if exc.code != "sync_target":
                raise
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.25)


def _titles(d: Daemon, vault: str) -> set[str]:
    return {r["title"] for r in d.call("memory.list", {"vault": vault})["records"]}


@pytest.fixture
def homes() -> Iterator[Callable[[dict[str, str], str], tuple[Daemon, Daemon]]]:
    started: list[Daemon] = []

    def make(env: dict[str, str], config: str) -> tuple[Daemon, Daemon]:
        pair = []
        for _ in range(2):
            home = short_tmpdir("sy")
            write_config(home, config)
            d = Daemon(home, env).start()
            started.append(d)
            pair.append(d)
        return pair[0], pair[1]

    yield make
    for d in started:
        d.stop()


def _pulls_until(d: Daemon, vault: str, holds: Callable[[set[str]], bool], what: str) -> None:
    """``sync.now`` on ``d`` until its titles satisfy ``holds`` (a folder-sync tool may still be copying)."""

    def probe() -> bool:
        d.call("sync.now", {"vault": vault})
        return holds(_titles(d, vault))

    _eventually(probe, what)


def _round_trip(a: Daemon, b: Daemon, target_a: str, target_b: str) -> None:
    """A makes a vault with two notes and syncs it to ``target_a``; B joins from ``target_b`` (the same
    target as B sees it); then an edit on B reaches A and a note added on A reaches B."""
    vid = create_vault(a, "personal", PASSPHRASE)
    ids = [
        a.call("memory.add", {"vault": vid, "title": f"note {i}", "body": f"body {i}"})["id"]
        for i in range(2)
    ]
    a.call("sync.add", {"vault": vid, "target": target_a})
    joined = _eventually(
        lambda: b.call("vault.join", {"target": target_b, "passphrase": PASSPHRASE}),
        "B joining from the target",
    )
    assert joined["vault_id"] == vid
    _pulls_until(b, vid, lambda t: t == {"note 0", "note 1"}, "both notes on B")
    b.call("memory.update", {"vault": vid, "id": ids[0], "title": "note 0, edited on B"})
    b.call("sync.now", {"vault": vid})
    _pulls_until(a, vid, lambda t: "note 0, edited on B" in t, "B's edit on A")
    a.call("memory.add", {"vault": vid, "title": "note 2", "body": "added on A after the join"})
    a.call("sync.now", {"vault": vid})
    _pulls_until(b, vid, lambda t: "note 2" in t, "A's new note on B")
    assert _titles(a, vid) == _titles(b, vid) == {"note 0, edited on B", "note 1", "note 2"}


@pytest.mark.skipif(rclone_serve.rclone_program() is None, reason=rclone_serve.RCLONE_MISSING)
def test_two_devices_sync_a_vault_through_an_rclone_webdav_remote(homes: Any, tmp_path: Path) -> None:
    server = rclone_serve.start("webdav", tmp_path / "served", tmp_path / "rclone")
    try:
        a, b = homes({"RCLONE_CONFIG": str(server.config)}, f'[sync]\nrclone_config = "{server.config}"\n')
        _round_trip(a, b, server.target("memories"), server.target("memories"))
        names = sorted(p.name for p in (tmp_path / "served" / "memories").iterdir())
        assert "memories-sync.json" in names and all(n == "memories-sync.json" or len(n) == 32 for n in names)
    finally:
        server.stop()


@pytest.mark.skipif(syncthing_program() is None, reason=SYNCTHING_MISSING)
def test_two_devices_sync_a_vault_through_two_syncthing_instances(homes: Any, tmp_path: Path) -> None:
    with SyncthingPair(tmp_path / "st", tmp_path / "A", tmp_path / "B") as pair:
        a, b = homes({}, "")
        _round_trip(a, b, str(pair.a.folder), str(pair.b.folder))
        pair.scan()
        pair.wait_until(pair.settled, DEADLINE, "Syncthing settling")
        mine = sorted(p.name for p in pair.a.folder.iterdir() if not p.name.startswith("."))
        assert mine == sorted(p.name for p in pair.b.folder.iterdir() if not p.name.startswith("."))
