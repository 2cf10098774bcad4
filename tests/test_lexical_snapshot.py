"""The sealed lexical snapshot through real daemons: written, restored after a restart, caught up
incrementally, rejected when damaged, never plaintext on disk, gone with its vault or compaction."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import IndexConfig
from memoriesd.index.caches import VaultIndex
from memoriesd.index.snapshot import SNAPSHOT_NAME, SnapshotRejected, read_snapshot, version_tag
from memoriesd.index.upkeep import MIN_BEHIND_ENTRIES
from memoriesd.text import segment as seg
from memoriesd.text.segment import DEFAULT
from memoriesd.vault import crypto
from memoriesd.vault.format import read_header
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import KdfParams, VaultStore, unwrap_key

from .conftest import Daemon, all_file_bytes, create_vault, short_tmpdir, write_config

PASS = "correct horse"
WORDS = (
    "river mountain lantern harvest copper meadow thunder orchard velvet glacier ember compass "
    "saffron quarry lagoon falcon marble prairie cobalt tundra juniper canyon beacon willow"
).split()
ZH = [
    "我们下个月去北京看长城，然后坐高铁去上海。中华人民共和国的首都是北京。",
    "图书馆的古籍修复工作需要耐心和细致的手艺。",
]
QUERIES: list[tuple[str, str]] = [
    ("river lantern", "any"),
    ("copper meadow thunder", "any"),
    ("glacier ember", "all"),
    ("velvet glacier", "phrase"),
    ("人民共和国", "phrase"),
    ("北京", "any"),
    ("古籍修复", "all"),
    ("willow beacon canyon", "any"),
]


def note(i: int) -> tuple[str, str]:
    """A deterministic note: a title and a few sentences drawn from WORDS."""
    w = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
    body = f"{' '.join(w[:6])}. The {w[6]} and the {w[7]} near the {w[8]}.\n\n{' '.join(w[9:])} notes, entry {i}."
    return f"{w[0].title()} {w[1]} {i}", body


@contextlib.contextmanager
def notes_daemon(config: str = "") -> Iterator[tuple[Daemon, str]]:
    """A daemon with a vault of 40 English notes and 2 Chinese ones."""
    root = short_tmpdir()
    home = root / "h"
    write_config(home, config)
    d = Daemon(home).start()
    try:
        vid = create_vault(d, passphrase=PASS)
        for i in range(40):
            title, body = note(i)
            d.call("memory.add", {"vault": vid, "title": title, "body": body, "tags": ["t"]})
        for i, text in enumerate(ZH):
            d.call("memory.add", {"vault": vid, "title": f"中文 {i}", "body": text})
        yield d, vid
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def vault_daemon() -> Iterator[tuple[Daemon, str]]:
    with notes_daemon() as got:
        yield got


def results(d: Daemon, vid: str) -> list[list[tuple[Any, ...]]]:
    """Every query's bm25 results: record, rounded score and fragment bytes, in rank order."""
    out = []
    for query, mode in QUERIES:
        r = d.call("rag.search", {"vault": vid, "query": query, "mode": "bm25", "match_mode": mode, "limit": 20})
        out.append([(h["record_id"], round(h["score"], 6), h.get("start"), h.get("end")) for h in r["results"]])
    assert any(out), "the queries must find something for the comparison to mean anything"
    return out


def snap(d: Daemon, vid: str) -> Path:
    return d.home / "vaults" / vid / SNAPSHOT_NAME


def restored_lines(d: Daemon) -> list[str]:
    return re.findall(r"lexical index restored from its sealed snapshot \(([^)]*)\)", d.log_text())


def rejected_lines(d: Daemon) -> list[str]:
    return re.findall(r"lexical snapshot not used \(([^)]*)\)", d.log_text())


def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def relock(d: Daemon, vid: str) -> None:
    d.call("vault.lock", {"vault": vid})
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})


def open_snapshot(d: Daemon, vid: str, *, key: bytes | None = None) -> Any:
    """Read the vault's snapshot in this process with the real vault key (or ``key``)."""
    vdir = d.home / "vaults" / vid
    master = key if key is not None else bytes(unwrap_key(read_header(vdir, vid), PASS.encode()))
    return read_snapshot(vdir, vid, crypto.Sealer(master, crypto.LABEL_LEXICAL_SNAPSHOT), version_tag(DEFAULT))


def test_snapshot_is_written_after_a_build_and_used_after_a_restart(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    before = results(d, vid)  # the first lexical query builds the index
    deadline = time.monotonic() + 60
    while not snap(d, vid).exists() and time.monotonic() < deadline:  # the background writer, once settled
        time.sleep(0.2)
    assert snap(d, vid).exists()
    # The line follows the file's rename; the upkeep after a change may write it first ("ingest").
    wait_for(lambda: re.search(r"lexical snapshot written \((settled|ingest)\)", d.log_text()))
    d.stop()
    d.start()
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    # Unlock itself starts the restore in the background: no search is needed for it.
    wait_for(lambda: restored_lines(d) == ["42 fragments, 0 records caught up, 0 removed"])
    assert results(d, vid) == before
    assert len(restored_lines(d)) == 1
    assert rejected_lines(d) == []


def test_stale_head_catches_up_to_the_same_results_as_a_fresh_build(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    results(d, vid)
    relock(d, vid)  # lock writes the snapshot (there was none)
    assert snap(d, vid).exists()
    written = snap(d, vid).read_bytes()
    # Changes after the snapshot's head: two new notes, one edited, one deleted.
    listed = d.call("memory.list", {"vault": vid})["records"]
    by_title = {r["title"]: r["id"] for r in listed}
    d.call("memory.add", {"vault": vid, "title": "Fresh river", "body": "a river lantern story told twice, river lantern"})
    d.call("memory.add", {"vault": vid, "title": "Another", "body": "glacier ember and velvet glacier"})
    d.call("memory.update", {"vault": vid, "id": by_title[note(3)[0]], "body": "copper copper meadow thunder rewritten"})
    d.call("memory.delete", {"vault": vid, "id": by_title[note(5)[0]]})
    relock(d, vid)  # few changes and no search: the snapshot on disk stays the old one
    assert snap(d, vid).read_bytes() == written
    caught_up = results(d, vid)
    assert restored_lines(d)[-1] == "42 fragments, 3 records caught up, 1 removed"
    # The same vault built from scratch: no snapshot, so the lock after the build writes one.
    d.call("vault.lock", {"vault": vid})
    snap(d, vid).unlink()
    restores = len(restored_lines(d))
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    assert results(d, vid) == caught_up
    assert len(restored_lines(d)) == restores


def damage(path: Path, how: str, other: Path) -> None:
    data = path.read_bytes()
    if how == "flipped":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1 :])
    elif how == "truncated":
        path.write_bytes(data[: len(data) - 100])
    elif how == "appended":
        path.write_bytes(data + b"\0" * 64)
    elif how == "other_vault":
        path.write_bytes(other.read_bytes())
    elif how == "garbage":
        path.write_bytes(b"MEMLEX\x00\x01" + bytes(200))
    elif how == "other_version":
        n = int.from_bytes(data[8:12], "big")
        header = json.loads(data[12 : 12 + n])
        header["version"] = "0" * 32
        new = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        path.write_bytes(data[:8] + len(new).to_bytes(4, "big") + new + data[12 + n :])
    else:  # pragma: no cover
        raise AssertionError(how)


def test_damaged_or_foreign_snapshots_are_rebuilt_never_trusted(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    other = create_vault(d, "other", passphrase=PASS)
    d.call("memory.add", {"vault": other, "title": "river", "body": "river lantern in another vault"})
    d.call("rag.search", {"vault": other, "query": "river", "mode": "bm25"})
    d.call("vault.lock", {"vault": other})
    expected = results(d, vid)
    d.call("vault.lock", {"vault": vid})
    kinds = ["flipped", "truncated", "appended", "other_vault", "garbage", "other_version"]
    for n, how in enumerate(kinds, start=1):
        assert snap(d, vid).exists(), how
        damage(snap(d, vid), how, snap(d, other))
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert results(d, vid) == expected, how
        assert len(rejected_lines(d)) == n, how
        d.call("vault.lock", {"vault": vid})  # the rebuilt index is written again at lock
    reasons = rejected_lines(d)
    assert sum("failed authentication" in r for r in reasons) >= 2  # a flipped byte, another vault's file
    assert any("tokenizer or index schema changed" in r for r in reasons)
    assert restored_lines(d) == []
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})  # the last rewrite is sound again
    assert results(d, vid) == expected
    assert restored_lines(d) == ["42 fragments, 0 records caught up, 0 removed"]
    assert d.proc is not None and d.proc.poll() is None


def test_no_plaintext_reaches_the_disk(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    d.call("memory.add", {"vault": vid, "title": "Flibbertigibbet Almanac", "body": "the quetzalcoatlzebra sleeps 金丝雀龙猫"})
    assert d.call("rag.search", {"vault": vid, "query": "quetzalcoatlzebra", "mode": "bm25"})["results"]
    d.call("vault.lock", {"vault": vid})
    assert snap(d, vid).exists()
    needles = [b"quetzalcoatlzebra", b"Flibbertigibbet", b"flibbertigibbet", b"almanac", "金丝雀龙猫".encode(), b"lantern"]
    files = all_file_bytes(d.home)
    for path, data in files:
        for needle in needles:
            assert needle not in data, f"{needle!r} in {path}"
    assert not [p for p, _ in files if p.name.endswith(".tmp")]
    # The check can see the words: they are in the snapshot once it is opened with the key.
    image = open_snapshot(d, vid)
    assert b"quetzalcoatlzebra" in image.db


def test_lock_seals_with_the_live_key_never_a_wiped_one(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    results(d, vid)
    d.call("vault.lock", {"vault": vid})  # due (no snapshot yet): written during lock
    assert "lexical snapshot written (lock)" in d.log_text()
    image = open_snapshot(d, vid)
    assert image.meta["docs"] and image.db
    with pytest.raises(SnapshotRejected, match="failed authentication"):
        open_snapshot(d, vid, key=bytes(crypto.KEY_BYTES))  # what a wiped (zeroed) key would seal with
    assert "KeyWiped" not in d.log_text() and "not written" not in d.log_text()


def test_deleted_vault_leaves_no_snapshot(vault_daemon: tuple[Daemon, str]) -> None:
    d, vid = vault_daemon
    results(d, vid)
    relock(d, vid)
    assert snap(d, vid).exists()
    results(d, vid)  # unlocked with a restored index when deleted
    d.call("vault.delete", {"vault": vid})
    assert not (d.home / "vaults" / vid).exists()
    assert not [p for p, _ in all_file_bytes(d.home) if "lexical" in p.name]


def test_compaction_rewrites_the_snapshot_without_deleted_rows() -> None:
    with notes_daemon() as (d, vid):
        gone = d.call("memory.add", {"vault": vid, "title": "doomed", "body": "xylophonequark appears only here"})["id"]
        results(d, vid)
        d.call("vault.lock", {"vault": vid})
        assert b"xylophonequark" in open_snapshot(d, vid).db
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        d.call("memory.delete", {"vault": vid, "id": gone})
        expected = results(d, vid)
        stats = d.call("vault.compact", {"vault": vid})
        assert stats["lexical_snapshot"] == "rewritten"
        assert b"xylophonequark" not in open_snapshot(d, vid).db
        relock(d, vid)
        assert results(d, vid) == expected
        assert restored_lines(d)[-1] == "42 fragments, 0 records caught up, 0 removed"
        # (A vault's process holds its own index only: no other vault can evict it before a compaction.)


def test_a_large_ingest_leaves_a_current_snapshot_so_the_next_unlock_applies_nothing(tmp_path: Path) -> None:
    """No search after the ingest: the upkeep builds the index and seals the snapshot in the
    background, so the first search after unlock restores it and catches up nothing."""
    folder = tmp_path / "notes"
    folder.mkdir()
    n_files = MIN_BEHIND_ENTRIES + 20
    for i in range(n_files):
        title, body = note(i)
        (folder / f"n{i:04d}.md").write_text(f"# {title}\n\n{body}\n", encoding="utf-8")
    with notes_daemon() as (d, vid):
        assert d.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})["added"] == n_files
        wait_for(lambda: "lexical snapshot written (ingest)" in d.log_text())
        assert snap(d, vid).exists()
        expected = results(d, vid)
        relock(d, vid)
        wait_for(lambda: len(restored_lines(d)) == 1)
        assert restored_lines(d) == [f"{n_files + 42} fragments, 0 records caught up, 0 removed"]
        assert results(d, vid) == expected
        assert rejected_lines(d) == []



def test_a_complete_snapshot_of_the_current_head_is_used_without_comparing_and_any_change_is_caught_up(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In one process: a snapshot written with every document (none pending) of the head the vault is
    at restores as ``complete`` (the first refresh compares nothing) and answers like the index it
    was written from; once the vault moved on, the restore compares and applies the change."""
    seg.configure(tmp_path_factory.mktemp("jieba"))
    vdir = tmp_path / "v"
    store = VaultStore.create(vdir, "vcomplete", "t", PASS.encode(), KdfParams(memory_kib=64, iterations=1, lanes=1))
    for i in range(30):
        title, body = note(i)
        store.commit([Record(new_record_id(), 1, "memory", title, body, False, ("t",), created=now(), updated=now())])
    built = VaultIndex(store, IndexConfig())
    built.refresh()
    assert built.bm25 is not None and built.keeper is not None
    built.bm25.flush()
    assert built.bm25.exports_every_document
    assert built.keeper.write("test")
    want = [h.frag_id for h in built.bm25.search("river lantern").hits]
    built.close()

    again = VaultIndex(store, IndexConfig())
    again.refresh()
    assert again.keeper is not None and again.keeper.info["complete"] is True
    assert again.bm25 is not None and [h.frag_id for h in again.bm25.search("river lantern").hits] == want
    assert again.n_fragments() == 30
    again.close()

    store.commit([Record(new_record_id(), 1, "memory", "late", "a zanzibarquokka river", False, (), created=now(), updated=now())])
    moved = VaultIndex(store, IndexConfig())
    moved.refresh()
    assert moved.keeper is not None and moved.keeper.info["complete"] is False
    assert moved.keeper.info["caught_up_records"] == 1
    assert moved.bm25 is not None and moved.bm25.search("zanzibarquokka").hits
    moved.close()
    store.close()
