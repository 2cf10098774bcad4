"""Search results as readable blocks, `--format text|json|jsonl|csv|md|files`, and status summaries.

One real daemon and vault for the module (files ingested from a real folder, a note without a
file), driven by the real CLI in subprocesses; colour on a terminal is checked through a real
pseudo-terminal.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.cells import cell_len

from .conftest import REPO, Daemon, cli_json, cli_ok, create_vault, run_cli, running_daemon

NARROW = {"COLUMNS": "80"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX = set("─│┌┐└┘├┤┬┴┼━┃┏┓┗┛╭╮╯╰")

GARDEN = """---
title: Garden soil notes
date: 2024-03-01
---
# Garden soil notes

The raised beds were built in 2021 from old pallets and lined with cardboard.

Every spring the beds get two barrows of compost, and the tomatoes go in after the last frost.
Test the pH of the clay soil before planting: clay soil drains slowly, so add grit and leaf mould.
"""
TRIP = "# Trip plan\n\nWe fly to Lisbon in May.\nThe hotel is near the river, booked for five nights.\n"


@dataclass
class Env:
    d: Daemon
    vid: str
    folder: Path
    note: str

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return cli_ok(self.d.home, *args, env=env)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_daemon() as d:
        vid = create_vault(d)
        folder = d.home.parent / "my notes"
        folder.mkdir()
        (folder / "garden.md").write_text(GARDEN)
        (folder / "trip plan.md").write_text(TRIP)
        (folder / "长城.md").write_text("# 长城\n\n长城很长，我们在八达岭看了长城和 soil 土壤。\n")
        d.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})
        note = d.call("memory.add", {"vault": vid, "title": "Shopping", "body": "Buy grit for the clay soil."})["id"]
        yield Env(d, vid, folder, str(note))


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if needle in line)


def test_each_result_is_a_block_with_its_file_and_the_line_of_the_best_match(env: Env) -> None:
    r = env.cli("rag", "search", env.vid, "clay soil grit", "--mode", "bm25", env=NARROW)
    found = cli_json(env.d.home, "rag", "search", env.vid, "clay soil grit", "--mode", "bm25")["results"]
    blocks = r.stdout.rstrip("\n").split("\n\n")
    assert len(blocks) == len(found) >= 2
    assert all(cell_len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    assert not ANSI.search(r.stdout) and not BOX & set(r.stdout)  # a pipe: no colour, no box drawing
    garden = env.folder / "garden.md"
    for block, hit in zip(blocks, found, strict=True):
        head, where, *snippet = block.splitlines()
        assert head.startswith(f"[{hit['label']}] ") and hit["title"] in head
        assert 1 <= len(snippet) <= 4 and any(w in " ".join(snippet).lower() for w in ("clay", "soil", "grit"))
        if hit["source"]:
            path, _, shown = where.strip().rpartition(":")
            assert path == hit["source"] and int(shown) >= hit["line"]
            assert any(w in Path(path).read_text().splitlines()[int(shown) - 1].lower() for w in ("clay", "soil", "grit"))
        if hit["source"] == str(garden):
            # The line the passage starts on counts the front matter; the shown line is the best match's.
            assert hit["line"] == _line_of(garden, "# Garden soil notes")
            assert where.strip() == f"{garden}:{_line_of(garden, 'clay soil')}"
        elif not hit["source"]:
            assert where.strip() == f"record {env.note}"
        # Ids, fingerprints and byte ranges only with --verbose.
        assert hit["fingerprint"][:12] not in block and f"{hit['start']}-{hit['end']}" not in block
    verbose = env.cli("rag", "search", env.vid, "clay soil grit", "--mode", "bm25", "--verbose", env=NARROW).stdout
    for hit in found:
        assert f"record {hit['record_id']}@{hit['revision']}" in verbose
        assert f"fingerprint {hit['fingerprint'][:12]}" in verbose and f"bytes {hit['start']}-{hit['end']}" in verbose


def test_memory_search_is_a_block_per_record_within_the_width(env: Env) -> None:
    found = cli_json(env.d.home, "memory", "search", env.vid, "soil")["results"]
    r = env.cli("memory", "search", env.vid, "soil", env={"COLUMNS": "60"})
    blocks = r.stdout.rstrip("\n").split("\n\n")
    assert len(blocks) == len(found) >= 3
    assert all(cell_len(line) <= 60 for line in r.stdout.splitlines()), r.stdout
    for i, (block, hit) in enumerate(zip(blocks, found, strict=True), start=1):
        assert block.startswith(f"{i}. ") and hit["title"] in block.splitlines()[0]
        where = f"{hit['source']}:{hit['line']}" if hit["source"] else f"record {hit['id']}"
        assert where.split(":")[0] in block
    cjk = next(b for b in blocks if "长城" in b.splitlines()[0])
    assert "土壤" in cjk  # a CJK passage wraps inside its run, within 60 cells


def _tty_run(home: Path, *args: str, env: dict[str, str]) -> str:
    """The CLI with stdout on a real pseudo-terminal (as a person runs it)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, cwd=str(REPO),
            env={k: v for k, v in {**os.environ, "COLUMNS": "80", **env}.items() if v is not None},
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(60) == 0
    finally:
        os.close(master)
    return b"".join(chunks).decode("utf-8")


def test_colour_on_a_terminal_only_unless_no_color_or_color_never(env: Env) -> None:
    args = ("rag", "search", env.vid, "clay soil", "--mode", "bm25")
    base = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    shown = _tty_run(env.d.home, *args, env={**base, "TERM": "xterm"})
    assert "\x1b[1;33mclay\x1b[0m" in shown.replace("\r\n", "\n")  # the query's words highlighted
    assert not ANSI.search(_tty_run(env.d.home, *args, env={**base, "TERM": "xterm", "NO_COLOR": "1"}))
    assert not ANSI.search(_tty_run(env.d.home, *args, "--color", "never", env={**base, "TERM": "xterm"}))
    forced = env.cli(*args, "--color", "always").stdout  # into a pipe, asked for
    assert "\x1b[1;33m" in forced and ANSI.sub("", forced) == env.cli(*args).stdout


def test_every_format_of_a_search_holds_the_json_results(env: Env) -> None:
    args = ("rag", "search", env.vid, "soil", "--mode", "bm25")
    doc = cli_json(env.d.home, *args)
    results = doc["results"]
    assert set(doc) == {"mode", "grouping", "results", "ignored_terms", "notices"}
    assert json.loads(env.cli(*args, "--format", "json").stdout) == doc
    lines = env.cli(*args, "--format", "jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines] == results
    rows = list(csv.DictReader(io.StringIO(env.cli(*args, "--format", "csv").stdout)))
    assert [row["record_id"] for row in rows] == [r["record_id"] for r in results]
    assert rows[0]["text"] == results[0]["text"] and rows[0]["line"] == str(results[0]["line"] or "")
    md = env.cli(*args, "--format", "md").stdout.splitlines()
    items = [line for line in md if line.startswith("- ")]
    assert len(items) == len(results)
    garden = env.folder / "garden.md"
    assert any(f"]({garden.as_uri()})" in line for line in items)
    files = env.cli(*args, "--format", "files").stdout.splitlines()
    assert files == list(dict.fromkeys(r["source"] for r in results if r["source"]))
    assert all(Path(f).is_file() for f in files)
    bad = run_cli(env.d.home, "--json", *args, "--format", "csv")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--format" in bad.stderr


def test_files_lists_each_file_once_with_spaces_kept(env: Env) -> None:
    out = env.cli("memory", "search", env.vid, "hotel lisbon soil", "--format", "files").stdout.splitlines()
    assert str(env.folder / "trip plan.md") in out and len(out) == len(set(out))


def test_listing_commands_speak_jsonl_csv_and_md(env: Env) -> None:
    records = cli_json(env.d.home, "memory", "list", env.vid)["records"]
    jl = [json.loads(x) for x in env.cli("memory", "list", env.vid, "--format", "jsonl").stdout.splitlines()]
    assert jl == records
    rows = list(csv.DictReader(io.StringIO(env.cli("memory", "list", env.vid, "--format", "csv").stdout)))
    assert [r["id"] for r in rows] == [r["id"] for r in records] and rows[0]["private"] in ("true", "false")
    listed = env.cli("memory", "list", env.vid, "--format", "files").stdout.splitlines()
    assert sorted(listed) == sorted(str(p) for p in env.folder.iterdir())  # the cards' files; the note has none
    assert [r["source"] for r in records if r["id"] == env.note] == [None]
    vaults = [json.loads(x) for x in env.cli("vault", "list", "--format", "jsonl").stdout.splitlines()]
    assert vaults == cli_json(env.d.home, "vault", "list")["vaults"]
    assert env.cli("vault", "status", "--format", "md").stdout.startswith("- **personal** ")
    history = env.cli("memory", "history", env.vid, env.note, "--format", "csv").stdout.splitlines()
    assert history[0] == "id,revision,updated,deleted,title" and history[1].startswith(f"{env.note},1,")
    pack = cli_json(env.d.home, "rag", "context", env.vid, "clay soil", "--mode", "bm25")
    files = env.cli("rag", "context", env.vid, "clay soil", "--mode", "bm25", "--format", "files").stdout.splitlines()
    assert files == list(dict.fromkeys(i["source"] for i in pack["items"] if i["source"])) and files
    garden = [i for i in pack["items"] if i["source"] == str(env.folder / "garden.md")]
    assert garden and garden[0]["line"] == _line_of(env.folder / "garden.md", "# Garden soil notes")  # as search says
    md = env.cli("rag", "context", env.vid, "clay soil", "--mode", "bm25", "--format", "md").stdout
    assert f"garden.md:{garden[0]['line']}]" in md
    # `files` is only offered where items have files.
    bad = run_cli(env.d.home, "vault", "list", "--format", "files")
    assert bad.returncode == 2 and "files" in bad.stderr


def test_rag_status_and_vault_status_are_titled_summaries_with_next_steps(env: Env) -> None:
    r = env.cli("rag", "status", env.vid, env=NARROW)
    lines = r.stdout.splitlines()
    assert lines[0] == f"Vault {env.vid}" and not BOX & set(r.stdout)
    assert all(line.strip() for line in lines[: lines.index("")])  # no empty header row
    text = r.stdout
    assert re.search(r"^  Documents\s+3 ingested files", text, re.M)
    assert re.search(r"^  Fragments\s+\d+ of 150,000 allowed \(<1%\)", text, re.M)
    assert re.search(r"^  Model\s+none, so search is lexical", text, re.M)
    assert "Next" in lines and "rag model-install" in text and f"rag search {env.vid} QUERY" in text
    assert all(cell_len(line) <= 80 for line in lines)
    v = env.cli("vault", "status", env.vid, env=NARROW).stdout
    assert v.startswith(f"Vault personal ({env.vid})\n") and re.search(r"^  Records\s+4$", v, re.M)
    assert "Device-only" in v and "rag status personal" in v
