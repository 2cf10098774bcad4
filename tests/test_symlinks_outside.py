"""Symbolic links that lead out of a folder: `rag ingest DIR -r` and watched folders skip and report them.

A link found inside the folder whose real path is outside it (a file, or a folder) is never read: a
notes folder shared or synced from elsewhere must not pull ``../outside/secret.txt`` into the vault.
Links that stay inside the folder work as before, and a link named on the command line is the user's
choice. A real daemon, the real CLI, real files and links under a temp dir.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Daemon, create_vault, run_cli, running_daemon
from .test_watch import CONFIG, add_watch, hits, row, synced, wait_for

SECRET = "zanzibarquill"  # only in the file outside the folder
AWAY = "marzipanolith"  # only in a folder outside it, reached through a folder link


def _tree(base: Path) -> Path:
    """notes/ with a real note, an inside link, a file link and a folder link out of it, and a loop."""
    (base / "outside" / "more").mkdir(parents=True)
    (base / "outside" / "secret.txt").write_text(f"# Secret\n\nthe {SECRET} password\n")
    (base / "outside" / "more" / "away.md").write_text(f"# Away\n\n{AWAY}\n")
    notes = base / "notes"
    (notes / ".drafts").mkdir(parents=True)
    (notes / "real.md").write_text("# Real\n\nquokka\n")
    (notes / ".drafts" / "plan.txt").write_text("# Plan\n\nnumbat\n")
    (notes / "plan.md").symlink_to(".drafts/plan.txt")  # inside the folder: ingested
    (notes / "steal.md").symlink_to("../outside/secret.txt")
    (notes / "elsewhere").symlink_to("../outside/more")
    (notes / "loop.md").symlink_to("loop.md")
    return notes


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon(CONFIG) as d:
        yield d


@pytest.fixture
def vid(daemon: Daemon, request: pytest.FixtureRequest) -> str:
    return create_vault(daemon, name=request.node.name[:60])


def test_ingest_recursive_skips_and_reports_links_out_of_the_folder(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    notes = _tree(tmp_path)
    r = run_cli(daemon.home, "rag", "ingest", vid, str(notes), "-r")
    assert r.returncode == 0, r.stderr  # a skip is not a refusal
    assert hits(daemon, vid, "quokka") and hits(daemon, vid, "numbat")  # the inside link still works
    assert not hits(daemon, vid, SECRET) and not hits(daemon, vid, AWAY)
    note = [line for line in r.stderr.splitlines() if "outside the folder" in line]
    assert note == ["2 skipped: symbolic links pointing outside the folder (elsewhere, steal.md); "
                    "to include what one points to, ingest that by name"], r.stderr

    again = run_cli(daemon.home, "--json", "rag", "ingest", vid, str(notes), "-r")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["unchanged"], out["skipped_outside"], out["skipped_outside_paths"]) == (2, 2, ["elsewhere", "steal.md"])
    assert not hits(daemon, vid, SECRET)

    named = run_cli(daemon.home, "rag", "ingest", vid, str(notes / "steal.md"))  # named: the user's choice
    assert named.returncode == 0, named.stderr
    assert hits(daemon, vid, SECRET)


def test_watched_folder_skips_and_reports_links_out_of_it(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    notes = _tree(tmp_path)
    add_watch(daemon, vid, notes, recursive=True)
    w = synced(daemon, vid, notes)
    assert hits(daemon, vid, "quokka") and hits(daemon, vid, "numbat")
    assert not hits(daemon, vid, SECRET) and not hits(daemon, vid, AWAY)
    assert w["skipped_outside"] == 2 and w["error"] is None
    status = run_cli(daemon.home, "rag", "status", vid)
    assert "2 skipped in the last sync (symbolic links pointing outside the folder)" in " ".join(status.stdout.split()), status.stdout

    (tmp_path / "outside" / "later.txt").write_text("# Later\n\nthe pangolinvault code\n")
    (notes / "later.md").symlink_to(tmp_path / "outside" / "later.txt")  # made while watched: one event

    def link_synced() -> bool:
        w = row(daemon, vid, notes)
        return bool(w["syncs"] >= 2 and w["pending"] == 0 and w["skipped_outside"] == 1)

    wait_for(link_synced, message="the sync of the new link")
    assert not hits(daemon, vid, "pangolinvault") and not hits(daemon, vid, SECRET)
