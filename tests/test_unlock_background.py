"""Unlock with the default (strong) Argon2id KDF while its background work runs: the sealed lexical
snapshot restore and a watched folder's catch-up both start at unlock, two vaults unlock at once from
two clients, and the process-wide KDF lock serialises their derivations (two Argon2id derivations at
once never return on this machine). Everything here must finish (every request has a timeout) and
find what changed.

The rest of the suite uses a cheap KDF (conftest.CHEAP_CONFIG); this file writes its own config.toml
without it, so the vaults are created and opened with the production parameters.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import VaultConfig
from memoriesd.index.keeper import _fragment
from memoriesd.text.fragments import Fragment

from .conftest import Daemon, DaemonError, create_vault, print_log_if_failed, short_tmpdir
from .test_watch import add_watch, synced, wait_for

TIMEOUT = 120.0  # seconds for any one request: a deadlock fails the test instead of hanging it
PASSPHRASES = {"notes": "notes passphrase", "other": "other passphrase"}


def call(d: Daemon, method: str, params: dict[str, Any]) -> Any:
    """One request on its own connection (one client), with a timeout."""
    s = d.connect_for(method, params)
    s.settimeout(TIMEOUT)
    try:
        msg = d.request(method, params, sock=s)
    finally:
        s.close()
    if "error" in msg:
        raise DaemonError(msg["error"]["code"], msg["error"]["message"])
    return msg["result"]


def at_once(*calls: tuple[str, dict[str, Any]], d: Daemon) -> list[Any]:
    """The requests sent together, each from its own client thread; their results in order."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def run(i: int, method: str, params: dict[str, Any]) -> None:
        try:
            start.wait(TIMEOUT)
            results[i] = call(d, method, params)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, m, p), daemon=True) for i, (m, p) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 10)
    assert not any(t.is_alive() for t in threads), "a request did not return (deadlock?)"
    assert not errors, errors
    return results


def bm25(d: Daemon, vid: str, query: str) -> list[dict[str, Any]]:
    return call(d, "rag.search", {"vault": vid, "query": query, "mode": "bm25"})["results"]  # type: ignore[no-any-return]


@pytest.fixture
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    root = short_tmpdir()
    home = root / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text("[watch]\ndebounce_seconds = 0.3\n")  # default [vault] KDF
    d = Daemon(home).start()
    try:
        yield d
        print_log_if_failed(request, d)
        assert d.stop() == 0
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_two_vaults_unlock_at_once_with_the_default_kdf_while_snapshot_restore_and_watch_catch_up_run(
    daemon: Daemon, tmp_path: Path
) -> None:
    defaults = VaultConfig()
    notes = create_vault(daemon, "notes", PASSPHRASES["notes"])
    other = create_vault(daemon, "other", PASSPHRASES["other"])
    header = (daemon.home / "vaults" / notes / "header.json").read_text()
    assert f'"memory_kib": {defaults.kdf_memory_kib}' in header and f'"iterations": {defaults.kdf_iterations}' in header

    folder = tmp_path / "watched"
    folder.mkdir()
    for i in range(40):
        (folder / f"n{i:02d}.md").write_text(f"# Note {i}\n\nroutine entry number {i} about the garden\n")
    (folder / "edit-locked.md").write_text("# Locked edit\n\nthe old text before the lock\n")
    (folder / "edit-live.md").write_text("# Live edit\n\nthe old text while unlocked\n")
    add_watch(daemon, notes, folder)
    synced(daemon, notes, folder)
    for i in range(30):
        call(daemon, "memory.add", {"vault": other, "title": f"memo {i}", "body": f"the other vault's memo {i} about harbours"})

    # A lexical query builds each index; lock writes its sealed snapshot (none on disk yet).
    assert bm25(daemon, notes, "garden") and bm25(daemon, other, "harbours")
    at_once(("vault.lock", {"vault": notes}), ("vault.lock", {"vault": other}), d=daemon)
    for vid in (notes, other):
        assert (daemon.home / "vaults" / vid / "lexical-index.bin").exists()
    restored = daemon.log_text().count("restored from its sealed snapshot")

    (folder / "edit-locked.md").write_text("# Locked edit\n\nrewritten while locked: periwinkle\n")
    at_once(
        ("vault.unlock", {"vault": notes, "passphrase": PASSPHRASES["notes"]}),
        ("vault.unlock", {"vault": other, "passphrase": PASSPHRASES["other"]}),
        d=daemon,
    )
    # Searches of both vaults at once, while the restores and the catch-up may still run.
    found_other, _ = at_once(
        ("rag.search", {"vault": other, "query": "harbours", "mode": "bm25"}),
        ("rag.search", {"vault": notes, "query": "garden", "mode": "bm25"}),
        d=daemon,
    )
    assert found_other["results"]
    assert wait_for(lambda: bm25(daemon, notes, "periwinkle"), TIMEOUT, "the edit made while locked (catch-up)")
    synced(daemon, notes, folder)

    (folder / "edit-live.md").write_text("# Live edit\n\nrewritten after unlock: marigold\n")
    assert wait_for(lambda: bm25(daemon, notes, "marigold"), TIMEOUT, "the edit made after unlock")
    assert bm25(daemon, other, "harbours")
    assert not bm25(daemon, other, "marigold")  # each vault has its own index
    # Both indexes came back from their sealed snapshots (no rebuild), and nothing failed in the background.
    log = daemon.log_text()
    assert log.count("restored from its sealed snapshot") == restored + 2
    assert "Traceback" not in log and "not restored at unlock" not in log


def test_restored_fragments_are_the_fragments_the_index_builds() -> None:
    """The snapshot restore builds fragments without the dataclass constructor (speed): the same
    fields, equal and hashing alike, so a change to Fragment cannot silently break restored indexes."""
    assert [f.name for f in dataclasses.fields(Fragment)] == [
        "record_id", "revision", "ordinal", "start", "end", "text", "fingerprint"
    ]
    made = _fragment("rid", 3, 1, 10, 20, "some text", "ab" * 8)
    built = Fragment("rid", 3, 1, 10, 20, "some text", "ab" * 8)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.text = "changed"  # type: ignore[misc]
