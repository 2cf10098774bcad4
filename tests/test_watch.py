"""Watched folders ([[watch.folder]], `rag watch`): a real daemon, real folders, real inotify events."""

from __future__ import annotations

import os
import shutil
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import parse_config
from memoriesd.errors import ConfigError

from .conftest import Daemon, DaemonError, create_vault, run_cli, running_daemon

DEBOUNCE = 0.3
CONFIG = f"[watch]\ndebounce_seconds = {DEBOUNCE}\n"
PASSPHRASE = "correct horse"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon(CONFIG) as d:
        yield d
        assert d.stop() == 0  # shutdown with folders watched: clean


@pytest.fixture
def vid(daemon: Daemon, request: pytest.FixtureRequest) -> str:
    return create_vault(daemon, name=request.node.name[:60], passphrase=PASSPHRASE)


def wait_for(what: Callable[[], Any], timeout: float = 60.0, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message or what}")
        time.sleep(0.05)


def add_watch(d: Daemon, vault: str, folder: Path, **opts: Any) -> None:
    """Append a [[watch.folder]] table to the daemon's config.toml and have it reload the list."""
    lines = ["", "[[watch.folder]]", f'vault = "{vault}"', f'path = "{folder}"']
    for key, value in opts.items():
        lines.append(f"{key} = " + ("true" if value is True else "false" if value is False else repr(value).replace("'", '"')))
    with open(d.home / "config.toml", "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    d.call("rag.watch_reload")


def row(d: Daemon, vid: str, folder: Path) -> dict[str, Any]:
    rows = [w for w in d.call("rag.status", {"vault": vid})["watch"] if w["path"] == str(folder)]
    assert len(rows) == 1, rows
    return rows[0]


def synced(d: Daemon, vid: str, folder: Path, syncs: int = 1) -> dict[str, Any]:
    """Wait until the folder has finished ``syncs`` syncs and has nothing pending."""

    def done() -> dict[str, Any] | None:
        w = row(d, vid, folder)
        return w if w["state"] == "watching" and w["pending"] == 0 and w["syncs"] >= syncs else None

    return wait_for(done, message=f"{folder} synced {syncs} time(s)")  # type: ignore[no-any-return]


def hits(d: Daemon, vid: str, query: str) -> list[dict[str, Any]]:
    return d.call("rag.search", {"vault": vid, "query": query, "mode": "bm25"})["results"]  # type: ignore[no-any-return]


def cards(d: Daemon, vid: str) -> dict[str, dict[str, Any]]:
    """Live cards by source path (listed again when a sync deleted one between the list and a read)."""
    while True:
        out = {}
        try:
            for r in d.call("memory.list", {"vault": vid, "kind": "card"})["records"]:
                full = d.call("memory.read", {"vault": vid, "id": r["id"]})
                out[full["meta"]["source"]] = full
        except DaemonError as exc:
            if exc.code != "not_found":
                raise
            continue
        return out


def src(p: Path) -> str:
    return os.path.join(os.path.realpath(p.parent), p.name)


def test_new_file_is_searchable_without_a_command_and_an_edit_is_a_new_revision(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    add_watch(daemon, vid, folder, recursive=True)
    synced(daemon, vid, folder)
    note = folder / "sub" / "zebra-notes.md"
    note.write_text("# Zebra migration\n\nThe wildebeest crossing happens in July.\n")
    first = wait_for(lambda: hits(daemon, vid, "wildebeest"), message="the new file to be searchable")
    assert first[0]["title"] == "Zebra migration" and first[0]["revision"] == 1 and first[0]["source"] == src(note)
    with note.open("a") as f:
        f.write("Kilimanjaro stays in view.\n")
    edited = wait_for(lambda: hits(daemon, vid, "kilimanjaro"), message="the edit to be searchable")
    assert edited[0]["record_id"] == first[0]["record_id"] and edited[0]["revision"] == 2
    w = synced(daemon, vid, folder, syncs=3)
    assert (w["added"], w["updated"], w["removed"], w["error"]) == (1, 1, 0, None)
    assert w["last_sync"] and abs(w["last_sync"] - time.time()) < 60
    log = daemon.log_text()
    assert "synced" in log
    for private in ("zebra", "Zebra", "wildebeest", "Kilimanjaro", str(folder)):
        assert private not in log  # counts and folder numbers only


def test_save_storm_is_one_ingest(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "storm"
    folder.mkdir()
    note = folder / "draft.md"
    note.write_text("# Storm\n\nfirst words\n")
    add_watch(daemon, vid, folder)
    before = synced(daemon, vid, folder)
    card = cards(daemon, vid)[src(note)]
    assert card["revision"] == 1
    for i in range(20):  # an editor saving again and again: truncate, write, close
        note.write_text(f"# Storm\n\nsaved version v{i}x of the draft\n")
    after = synced(daemon, vid, folder, syncs=before["syncs"] + 1)
    time.sleep(DEBOUNCE * 4)  # nothing more comes: our own reads are no events
    after = synced(daemon, vid, folder, syncs=after["syncs"])
    assert after["syncs"] == before["syncs"] + 1 and after["updated"] == 1
    now = daemon.call("memory.read", {"vault": vid, "id": card["id"]})
    assert now["revision"] == 2 and "v19x" in now["body"]


def test_delete_with_prune_removes_the_card_and_without_prune_keeps_it(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    pruned, kept = tmp_path / "pruned", tmp_path / "kept"
    for folder, word in ((pruned, "aardvark"), (kept, "bandicoot")):
        folder.mkdir()
        (folder / f"{word}.md").write_text(f"# {word}\n\nall about the {word}\n")
    add_watch(daemon, vid, pruned, prune=True)
    add_watch(daemon, vid, kept)
    synced(daemon, vid, pruned)
    k = synced(daemon, vid, kept)
    assert set(cards(daemon, vid)) == {src(pruned / "aardvark.md"), src(kept / "bandicoot.md")}
    (pruned / "aardvark.md").unlink()
    (kept / "bandicoot.md").unlink()
    wait_for(lambda: src(pruned / "aardvark.md") not in cards(daemon, vid), message="the pruned card to go")
    assert row(daemon, vid, pruned)["removed"] == 1
    synced(daemon, vid, kept, syncs=k["syncs"] + 1)
    assert set(cards(daemon, vid)) == {src(kept / "bandicoot.md")}
    assert hits(daemon, vid, "bandicoot") and not hits(daemon, vid, "aardvark")


def test_moved_or_renamed_file_keeps_its_card(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "moves"
    folder.mkdir()
    (folder / "a.md").write_text("# Nomad\n\nthis note travels\n")
    add_watch(daemon, vid, folder, recursive=True, prune=True)
    synced(daemon, vid, folder)
    card_id = cards(daemon, vid)[src(folder / "a.md")]["id"]

    def now_at(p: Path) -> dict[str, Any]:
        got = wait_for(lambda: cards(daemon, vid).get(src(p)), message=f"the card at {p.name}")
        assert len(cards(daemon, vid)) == 1
        return got  # type: ignore[no-any-return]

    os.rename(folder / "a.md", folder / "b.md")  # rename
    assert now_at(folder / "b.md")["id"] == card_id
    (folder / "sub").mkdir()
    os.rename(folder / "b.md", folder / "sub" / "c.md")  # move into a subfolder
    moved = now_at(folder / "sub" / "c.md")
    assert moved["id"] == card_id and moved["meta"]["path"] == "sub/c.md"
    os.rename(folder / "sub", folder / "renamed")  # the folder holding it moves
    assert now_at(folder / "renamed" / "c.md")["id"] == card_id
    assert row(daemon, vid, folder)["moved"] == 3
    shutil.copy(folder / "renamed" / "c.md", folder / "copy.md")  # a copy is a new card
    wait_for(lambda: len(cards(daemon, vid)) == 2, message="the copy's card")
    assert cards(daemon, vid)[src(folder / "renamed" / "c.md")]["id"] == card_id


def test_a_private_card_stays_private_when_its_file_is_edited_or_moved(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "private"
    folder.mkdir()
    (folder / "diary.md").write_text("# Diary\n\nmy secret marmoset\n")
    out = daemon.call("rag.ingest", {"vault": vid, "paths": [str(folder / "diary.md")], "private": True})
    card_id = out["records"][0]["id"]
    add_watch(daemon, vid, folder, prune=True)
    w = synced(daemon, vid, folder)
    (folder / "diary.md").write_text("# Diary\n\nmy secret marmoset, edited\n")
    w = synced(daemon, vid, folder, syncs=w["syncs"] + 1)
    os.rename(folder / "diary.md", folder / "journal.md")
    w = synced(daemon, vid, folder, syncs=w["syncs"] + 1)
    assert (w["updated"], w["moved"]) == (1, 1)
    rec = daemon.call("memory.read", {"vault": vid, "id": card_id})
    assert rec["private"] is True and rec["revision"] == 3 and rec["meta"]["source"] == src(folder / "journal.md")
    assert not hits(daemon, vid, "marmoset")


def test_changes_while_locked_are_caught_up_at_unlock(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "offline"
    folder.mkdir()
    for name in ("keep", "edit", "gone", "mv"):
        (folder / f"{name}.md").write_text(f"# {name}\n\nthe {name} note\n")
    add_watch(daemon, vid, folder, prune=True)
    synced(daemon, vid, folder)
    before = cards(daemon, vid)
    daemon.call("vault.lock", {"vault": vid})
    states = [w["state"] for w in daemon.call("rag.watch_reload")["watches"] if w["path"] == str(folder)]
    assert states == ["locked"]
    (folder / "new.md").write_text("# new\n\nwritten while locked\n")
    (folder / "edit.md").write_text("# edit\n\nchanged while locked\n")
    (folder / "gone.md").unlink()
    os.rename(folder / "mv.md", folder / "moved.md")
    time.sleep(DEBOUNCE * 2)
    daemon.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
    w = synced(daemon, vid, folder)
    assert (w["added"], w["updated"], w["moved"], w["removed"]) == (1, 1, 1, 1)
    after = cards(daemon, vid)
    assert set(after) == {src(folder / n) for n in ("keep.md", "edit.md", "new.md", "moved.md")}
    assert after[src(folder / "keep.md")]["revision"] == 1  # unchanged: a no-op
    assert after[src(folder / "edit.md")]["revision"] == 2 and "changed while locked" in after[src(folder / "edit.md")]["body"]
    assert after[src(folder / "moved.md")]["id"] == before[src(folder / "mv.md")]["id"]


def test_removed_folder_is_reported_never_pruned_and_the_daemon_keeps_serving(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "usb"
    folder.mkdir()
    (folder / "kept.md").write_text("# Kept\n\nplatypus facts\n")
    add_watch(daemon, vid, folder, recursive=True, prune=True)
    synced(daemon, vid, folder)
    shutil.rmtree(folder)
    w = wait_for(lambda: (r := row(daemon, vid, folder))["state"] == "error" and r, message="the error state")
    assert "does not exist" in w["error"] and "\n" not in w["error"]
    assert hits(daemon, vid, "platypus")  # an unmounted disk is not an empty folder: nothing pruned
    assert daemon.call("daemon.status")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
    folder.mkdir()  # back: watched again and caught up
    (folder / "back.md").write_text("# Back\n\nechidna facts\n")
    wait_for(lambda: hits(daemon, vid, "echidna"), message="the folder to be watched again")
    w = synced(daemon, vid, folder)
    assert w["error"] is None
    wait_for(lambda: not hits(daemon, vid, "platypus"), message="the prune of the file that is gone")


def test_a_folder_found_empty_at_unlock_prunes_nothing(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "mountpoint"
    folder.mkdir()
    (folder / "only.md").write_text("# Only\n\nthe pangolin note\n")
    add_watch(daemon, vid, folder, prune=True)
    synced(daemon, vid, folder)
    daemon.call("vault.lock", {"vault": vid})
    (folder / "only.md").unlink()  # as an unmounted disk looks: an empty folder
    daemon.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
    w = synced(daemon, vid, folder)
    assert w["removed"] == 0 and "found empty" in w["notice"] and hits(daemon, vid, "pangolin")
    (folder / "again.md").write_text("# Again\n\nthe second note\n")
    wait_for(lambda: hits(daemon, vid, "second"), message="the second note")
    (folder / "again.md").unlink()  # a deletion seen as it happens still prunes its card
    wait_for(lambda: not hits(daemon, vid, "second"), message="the prune of the second note")
    assert hits(daemon, vid, "pangolin")


def test_symlink_loops_do_not_hang_the_watch(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "loops"
    (folder / "sub").mkdir(parents=True)
    (folder / "real.md").write_text("# Real\n\nquokka\n")
    (folder / "sub" / "deep.md").write_text("# Deep\n\nwombat\n")
    os.symlink(".", folder / "self-dir")  # folder -> itself
    os.symlink("..", folder / "sub" / "up")  # subfolder -> its parent
    os.symlink("loop.md", folder / "loop.md")  # a file link to itself
    os.symlink("pong.md", folder / "ping.md")
    os.symlink("ping.md", folder / "pong.md")
    add_watch(daemon, vid, folder, recursive=True, prune=True)
    w = synced(daemon, vid, folder)
    assert set(cards(daemon, vid)) == {src(folder / "real.md"), src(folder / "sub" / "deep.md")}
    assert w["refused"] == 3 and all("link" in r["message"] for r in w["refusals"])
    (folder / "sub" / "up" / "later.md").write_text("# Later\n\nnumbat\n")  # written through the loop
    wait_for(lambda: hits(daemon, vid, "numbat"), message="a file added after the loops")
    locker = threading.Thread(target=lambda: daemon.call("vault.lock", {"vault": vid}), daemon=True)
    locker.start()
    locker.join(120)
    assert not locker.is_alive(), "lock hangs on a watched folder with link loops"
    assert daemon.call("vault.status", {"vault": vid})["locked"]


def test_file_written_while_being_read_ends_as_its_final_content(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "slow"
    folder.mkdir()
    add_watch(daemon, vid, folder)
    synced(daemon, vid, folder)
    note = folder / "log.md"
    lines = [f"line {i} of a long note about kangaroos and their habits in the outback\n" for i in range(3000)]

    def writer() -> None:  # bursts with pauses longer than the debounce: syncs run while it writes
        with note.open("w") as f:
            f.write("# Slow\n\n")
            for burst in range(6):
                for line in lines[burst * 500 : (burst + 1) * 500]:
                    f.write(line)
                f.flush()
                time.sleep(DEBOUNCE * 1.3)

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    final = note.read_text()
    wait_for(lambda: (c := cards(daemon, vid).get(src(note))) is not None and c["body"] == final, message="the final content")
    assert len(cards(daemon, vid)) == 1


def test_include_globs_and_a_flat_watch_pick_the_files(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    (folder / "journal").mkdir(parents=True)
    for name in ("a.org", "b.txt", "c.md", ".hidden.org", "journal/d.org"):
        (folder / name).write_text(f"{name} mentions the okapi\n")
    add_watch(daemon, vid, folder, include=["*.org", "*.txt"])
    synced(daemon, vid, folder)
    (folder / "e.org").write_text("e.org mentions the okapi\n")
    wait_for(lambda: src(folder / "e.org") in cards(daemon, vid), message="the new .org file")
    assert set(cards(daemon, vid)) == {src(folder / n) for n in ("a.org", "b.txt", "e.org")}


def test_rag_watch_cli_writes_config_keeping_comments_and_unwatch_removes_it(tmp_path: Path) -> None:
    folder = tmp_path / "cli notes"
    folder.mkdir()
    (folder / "hello.md").write_text("# Hello\n\nthe capybara is calm\n")
    with running_daemon("# the user's own words, kept\n[search]\ncandidates = 60  # fusion constant\n" + CONFIG) as d:
        vid = create_vault(d, passphrase=PASSPHRASE)
        config = d.home / "config.toml"
        original = config.read_text()
        r = run_cli(d.home, "rag", "watch", "personal", str(folder), "--recursive", "--include", "*.md")
        assert r.returncode == 0, r.stderr
        assert "added the watch" in r.stderr and "caught up now" in r.stderr
        text = config.read_text()
        assert text.startswith(original.rstrip("\n"))  # every line and comment of the user's file kept
        assert tomllib.loads(text)["watch"]["folder"] == [{"vault": vid, "path": str(folder), "recursive": True, "include": ["*.md"], "prune": False}]
        wait_for(lambda: hits(d, vid, "capybara"), message="the folder to be ingested")
        r = run_cli(d.home, "rag", "watch", "personal", str(folder), "--recursive", "--prune")
        assert r.returncode == 0 and "updated the watch" in r.stderr, r.stderr
        watches = tomllib.loads(config.read_text())["watch"]["folder"]
        assert len(watches) == 1 and watches[0]["prune"] is True and "include" not in watches[0]
        wait_for(lambda: row(d, vid, folder)["prune"] and row(d, vid, folder)["state"] == "watching")
        r = run_cli(d.home, "rag", "status", "personal")
        assert r.returncode == 0 and "watch" in r.stdout and "watching" in r.stdout, r.stdout
        assert run_cli(d.home, "rag", "watch", "personal", str(folder / "hello.md")).returncode == 2
        r = run_cli(d.home, "rag", "unwatch", "personal", str(folder))
        assert r.returncode == 0 and "stopped watching" in r.stderr, r.stderr
        text = config.read_text()
        assert "[[watch.folder]]" not in text and "# the user's own words, kept" in text and "# fusion constant" in text
        assert d.call("rag.status", {"vault": vid})["watch"] == []
        assert hits(d, vid, "capybara")  # its cards stay
        r = run_cli(d.home, "rag", "unwatch", "personal", str(folder))
        assert r.returncode == 4 and "no [[watch.folder]] table" in r.stderr and r.stderr.count("\n") == 1
        d.call("vault.lock", {"vault": vid})
        r = run_cli(d.home, "rag", "watch", vid, str(folder))
        assert r.returncode == 0 and "starts when vault personal is unlocked" in r.stderr, r.stderr


def test_watch_tables_are_validated_with_one_line_naming_the_key(tmp_path: Path) -> None:
    base = tmp_path
    cfg = parse_config({"watch": {"folder": [{"vault": "v", "path": "notes", "include": ["*.md"], "recursive": True}]}}, base)
    assert cfg.watch.folders[0].path == str(base / "notes") and cfg.watch.folders[0].include == ("*.md",)
    cases = [
        ({"folder": {"vault": "v", "path": "/x"}}, "watch.folder must be an array of tables"),
        ({"folder": [{"vault": "v"}]}, "needs path"),
        ({"folder": [{"path": "/x"}]}, "needs vault"),
        ({"folder": [{"vault": "v", "path": "/x", "prune": "yes"}]}, "watch.folder[1].prune"),
        ({"folder": [{"vault": "v", "path": "/x"}, {"vault": "v", "path": "/x", "typo": 1}]}, "watch.folder[2].typo"),
        ({"folder": [{"vault": "v", "path": "/x", "include": "*.md"}]}, "watch.folder[1].include"),
        ({"folder": [{"vault": "v", "path": "/x"}, {"vault": "v", "path": "/x/"}]}, "both watch /x"),
        ({"debounce_seconds": 0}, "watch.debounce_seconds"),
    ]
    for table, expected in cases:
        with pytest.raises(ConfigError) as exc:
            parse_config({"watch": table}, base)
        assert expected in exc.value.message and "\n" not in exc.value.message


def test_a_deleted_or_unknown_vault_is_an_error_row_not_a_failure(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    folder = tmp_path / "orphan"
    folder.mkdir()
    add_watch(daemon, vid, folder)
    synced(daemon, vid, folder)
    daemon.call("vault.delete", {"vault": vid})  # stops the watch like a lock
    add_watch(daemon, "no-such-vault", tmp_path)
    rows = {w["vault"]: w for w in daemon.call("rag.watch_reload")["watches"]}
    for ref in (vid, "no-such-vault"):
        assert rows[ref]["state"] == "error" and f"no vault {ref}" in rows[ref]["error"]
    (folder / "late.md").write_text("# Late\n\nafter the vault was deleted\n")
    assert daemon.call("daemon.status")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
