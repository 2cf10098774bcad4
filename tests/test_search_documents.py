"""`rag search` gives one hit per document by default: the best fragment of each file, note or
conversation, "+N more in this file" with the lines of the others, and ``--limit`` counting documents;
``--fragments`` gives the ranked fragments themselves.

A real memoriesd on a temp home, a folder of Markdown files ingested with `rag ingest`, the real CLI.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Daemon, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .tinymodel import make_tiny_model

WIDE = {"COLUMNS": "200"}


def long_file() -> str:
    """About 14 fragments, "heron" in every paragraph, each paragraph on its own lines."""
    paras = [
        f"## Part {i}\n\nThe heron stood in the shallows at dawn number {i}, and the heron waited.\n"
        + "Reeds and water and mud, the long wait of a heron. " * 12
        for i in range(14)
    ]
    return "# Heron journal\n\n" + "\n\n".join(paras) + "\n"


@dataclass
class Folder:
    d: Daemon
    vid: str
    root: Path
    long_id: str
    ids: dict[str, str]  # file name -> record id
    note: str


@pytest.fixture(scope="module")
def folder() -> Iterator[Folder]:
    root = short_tmpdir()
    model = root / "tiny"
    make_tiny_model(model, seed=5)
    home = root / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{model}"\n[search]\nmin_cosine = -1\n')
    docs = root / "notes"
    docs.mkdir()
    (docs / "heron-journal.md").write_text(long_file(), encoding="utf-8")
    for i in range(6):
        (docs / f"bird-{i}.md").write_text(
            f"# Bird {i}\n\nA heron flew past the pier on day {i}.\n", encoding="utf-8"
        )
    (docs / "soup.md").write_text("# Soup\n\nLentils, onions and stock.\n", encoding="utf-8")
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        report = d.call("rag.ingest", {"vault": vid, "paths": [str(docs)], "recursive": True})
        ids = {Path(r["path"]).name: r["id"] for r in report["records"]}
        note = str(
            d.call("memory.add", {"vault": vid, "title": "Pier", "body": "Saw a heron by the pier."})["id"]
        )
        d.call("rag.index", {"vault": vid})
        yield Folder(d, vid, docs, ids["heron-journal.md"], ids, note)
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def search(f: Folder, *args: str) -> dict:
    return cli_json(f.d.home, "rag", "search", f.vid, "heron", *args)


def test_the_long_file_fills_the_fragment_list(folder: Folder) -> None:
    """The premise: per fragment, the first five hits are all the long file's."""
    out = search(folder, "--mode", "bm25", "--limit", "5", "--fragments")
    assert out["grouping"] == "fragment"
    assert [r["record_id"] for r in out["results"]] == [folder.long_id] * 5
    assert all("more" not in r for r in out["results"])


@pytest.mark.parametrize("mode", ["bm25", "vector", "hybrid"])
def test_limit_counts_documents_in_every_mode(folder: Folder, mode: str) -> None:
    out = search(folder, "--mode", mode, "--limit", "5")
    ids = [r["record_id"] for r in out["results"]]
    assert out["grouping"] == "document"
    assert len(ids) == 5 and len(set(ids)) == 5
    assert [r["label"] for r in out["results"]] == ["S1", "S2", "S3", "S4", "S5"]


def test_the_best_fragment_stands_for_its_document_with_the_others_counted(folder: Folder) -> None:
    frags = search(folder, "--mode", "bm25", "--limit", "100", "--fragments")["results"]
    docs = search(folder, "--mode", "bm25", "--limit", "100")["results"]
    # Grouping never reorders: the documents come in the order of their first fragment.
    first_seen = list(dict.fromkeys(r["record_id"] for r in frags))
    assert [r["record_id"] for r in docs] == first_seen
    assert set(first_seen) == {*folder.ids.values(), folder.note} - {folder.ids["soup.md"]}
    long_doc = next(r for r in docs if r["record_id"] == folder.long_id)
    long_frags = [r for r in frags if r["record_id"] == folder.long_id]
    assert long_doc["text"] == long_frags[0]["text"] and long_doc["start"] == long_frags[0]["start"]
    assert long_doc["matches"] == len(long_frags) >= 10 and long_doc["more"] == len(long_frags) - 1
    spans = long_doc["more_fragments"]
    assert [(s["start"], s["end"]) for s in spans] == sorted((r["start"], r["end"]) for r in long_frags[1:])
    assert all(isinstance(s["line"], int) and s["end_line"] >= s["line"] for s in spans)
    assert [s["line"] for s in spans] == [r["line"] for r in sorted(long_frags[1:], key=lambda r: r["start"])]
    short = next(r for r in docs if r["record_id"] == folder.ids["bird-0.md"])
    assert short["matches"] == 1 and short["more"] == 0 and short["more_fragments"] == []
    assert (short["line"], short["end_line"]) == (1, 3)  # "# Bird 0", a blank line, then the text


def test_format_files_limit_n_prints_n_files(folder: Folder) -> None:
    r = run_cli(
        folder.d.home,
        "rag",
        "search",
        folder.vid,
        "heron",
        "--mode",
        "bm25",
        "--format",
        "files",
        "--limit",
        "4",
    )
    assert r.returncode == 0, r.stderr
    paths = r.stdout.splitlines()
    assert len(paths) == 4 and len(set(paths)) == 4
    assert all(Path(p).parent == folder.root.resolve() for p in paths)
    assert str(folder.root.resolve() / "heron-journal.md") in paths


def test_text_output_says_how_many_more_fragments_matched_in_the_file(folder: Folder) -> None:
    out = search(folder, "--mode", "bm25", "--limit", "3")
    more = next(r["more"] for r in out["results"] if r["record_id"] == folder.long_id)
    r = run_cli(
        folder.d.home, "rag", "search", folder.vid, "heron", "--mode", "bm25", "--limit", "3", env=WIDE
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("heron-journal.md") == 1
    assert f"+{more} more in this file (lines " in r.stdout
    assert r.stdout.count("more in this") == 1  # the short files matched once
    assert "3 results (bm25)" in r.stderr
    frag = run_cli(
        folder.d.home,
        "rag",
        "search",
        folder.vid,
        "heron",
        "--mode",
        "bm25",
        "--limit",
        "3",
        "--fragments",
        env=WIDE,
    )
    assert frag.returncode == 0, frag.stderr
    assert "more in this" not in frag.stdout and "3 fragments (bm25)" in frag.stderr


def test_a_note_without_a_file_says_more_in_this_note(folder: Folder) -> None:
    d = folder.d
    rid = str(
        d.call(
            "memory.add",
            {"vault": folder.vid, "title": "Egret log", "body": long_file().replace("heron", "egret")},
        )["id"]
    )
    try:
        out = cli_json(d.home, "rag", "search", folder.vid, "egret", "--mode", "bm25", "--limit", "3")
        assert [r["record_id"] for r in out["results"]] == [rid] and out["results"][0]["more"] >= 10
        r = run_cli(d.home, "rag", "search", folder.vid, "egret", "--mode", "bm25", env=WIDE)
        assert r.returncode == 0, r.stderr
        assert f"+{out['results'][0]['more']} more in this note (lines " in r.stdout
    finally:
        d.call("memory.delete", {"vault": folder.vid, "id": rid})


def test_a_grant_may_ask_for_fragments(folder: Folder) -> None:
    d = folder.d
    token = d.call("grant.create", {"vault": folder.vid, "scopes": ["retrieve"]})["token"]
    s = d.connect(token=token)
    try:
        assert "result" in d.request("session.grant", {"token": token}, sock=s)
        docs = d.request("rag.search", {"query": "heron", "mode": "bm25", "limit": 3}, sock=s)["result"]
        frags = d.request(
            "rag.search", {"query": "heron", "mode": "bm25", "limit": 3, "fragments": True}, sock=s
        )["result"]
    finally:
        s.close()
    assert len({r["record_id"] for r in docs["results"]}) == 3
    assert [r["record_id"] for r in frags["results"]] == [folder.long_id] * 3


def test_ask_and_context_still_rank_fragments(folder: Folder) -> None:
    """The answering surfaces take evidence per fragment: several of the long file may be sent."""
    pack = cli_json(
        folder.d.home, "rag", "context", folder.vid, "heron", "--mode", "bm25", "--budget", "2000"
    )
    ids = [i["record_id"] for i in pack["items"]]
    assert ids.count(folder.long_id) >= 2


def test_the_lines_of_overlapping_fragments_are_merged_and_named_by_kind() -> None:
    from memories_cli.search_cmds import more_text

    spans = [
        {"line": 3, "end_line": 3},
        {"line": 1, "end_line": 3},
        {"line": 9, "end_line": 12},
        {"line": None, "end_line": None},
    ]
    assert (
        more_text({"more": 4, "source": "/n/a.md", "more_fragments": spans})
        == "+4 more in this file (lines 1-3, 9-12)"
    )
    one_line = [{"line": 3, "end_line": 3}] * 2  # an abstract on one long line
    assert (
        more_text({"more": 2, "source": "/n/a.md", "more_fragments": one_line})
        == "+2 more in this file (line 3)"
    )
    assert (
        more_text({"more": 1, "kind": "conversation", "more_fragments": []}) == "+1 more in this conversation"
    )
    assert more_text({"more": 0, "source": "/n/a.md"}) == "" and more_text({"label": "S1"}) == ""
