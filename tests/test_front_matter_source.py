"""Front matter stays out of the text people and models read, and `source` is the file's absolute path.

Real daemon, real CLI processes (each run from its own working directory), real FTS5 and jieba, and a
real loopback generation service for `rag ask`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, create_vault, short_tmpdir, write_config
from .servers import Mirror, Scripted

CHAT = "/v1/chat/completions"
PASS = "correct horse"
CANARY = "quillfeatherwick"  # a front matter value: found through the metadata, never shown as text
NOTE = (
    "---\n"
    "tags: [travel, 旅行]\n"
    f"reviewer: {CANARY}\n"
    "---\n"
    "# 旅行计划\n\n"
    "我们下个月去北京看长城，然后坐高铁去上海。Pack the rain jacket for the Great Wall hike.\n"
)
FRONT = NOTE[: NOTE.index("# 旅行计划")]


@pytest.fixture
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


@pytest.fixture
def env(server: Mirror) -> Iterator[tuple[Daemon, str, Path]]:
    """A daemon with a loopback generation service, a vault, and a folder for notes."""
    root = short_tmpdir()
    home = root / "h"
    write_config(home, f'[generation]\nprotocol = "compatible"\nurl = "{server.url}{CHAT}"\nmodel = "test-model"\n')
    d = Daemon(home).start()
    try:
        vid = create_vault(d, passphrase=PASS)
        notes = root / "notes"
        notes.mkdir()
        yield d, vid, notes
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli(d: Daemon, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real `memories` CLI run from ``cwd`` (relative paths are the user's, from there)."""
    return subprocess.run(
        [sys.executable, "-m", "memories_cli.main", "--home", str(d.home), *args],
        input="", capture_output=True, text=True, cwd=str(cwd), env=dict(os.environ, **(env or {})), timeout=120,
    )


def cli_json(d: Daemon, cwd: Path, *args: str) -> Any:
    r = cli(d, cwd, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def real(p: Path) -> str:
    return os.path.join(os.path.realpath(p.parent), p.name)


def no_front_matter(text: str) -> None:
    assert CANARY not in text and "reviewer" not in text and "tags:" not in text and "---" not in text, text


@pytest.mark.parametrize(
    "body,skipped",
    [
        (NOTE, True),
        (NOTE.replace("\n", "\r\n"), True),  # CRLF line ends
        ("---\ntitle: Long\n---\n" + "长城很长。Great walls are long. " * 120, True),  # many fragments
        ("---\nauthor: {name: x}\n---\nnested YAML is outside the subset: plain text\n", False),
        ("---\ntags: [x]\nno closing line, so no front matter\n", False),
    ],
)
def test_a_cards_fragments_start_after_its_front_matter_with_exact_offsets(body: str, skipped: bool) -> None:
    from memoriesd.index.docs import index_doc
    from memoriesd.text.files import parse_front_matter
    from memoriesd.vault.records import Record

    doc = index_doc(Record("r", 1, "card", "t", body, False, ()), b"k" * 32)
    data = body.encode("utf-8")
    assert doc.fragments
    for f in doc.fragments:
        assert data[f.start : f.end].decode("utf-8") == f.text
    first = doc.fragments[0]
    if skipped:
        fm = parse_front_matter(body)
        assert fm is not None and first.start == len(body[: fm[1]].encode("utf-8"))
        assert all("---" not in f.text for f in doc.fragments)
    else:
        assert first.start == 0 and first.text.startswith("---")
    # Other kinds keep their text whole: a memory typed with a --- block shows it.
    assert index_doc(Record("m", 1, "memory", "t", body, False, ()), b"k" * 32).fragments[0].start == 0


def test_a_card_of_only_front_matter_is_found_by_its_title_and_metadata() -> None:
    from memoriesd.index.docs import index_doc
    from memoriesd.vault.records import Record

    doc = index_doc(Record("r", 1, "card", "Trip", FRONT, False, ("travel",), meta={"reviewer": CANARY}), b"k" * 32)
    assert [(f.start, f.end, f.text) for f in doc.fragments] == [(0, 0, "")]
    assert CANARY in doc.meta_text and "travel" in doc.meta_text


def test_front_matter_is_never_fragment_text_and_its_values_stay_searchable(env: tuple[Daemon, str, Path], server: Mirror) -> None:
    d, vid, notes = env
    (notes / "trip.md").write_text(NOTE, encoding="utf-8")
    out = cli_json(d, notes, "rag", "ingest", vid, "trip.md")
    rid = out["records"][0]["id"]
    body = d.call("memory.read", {"vault": vid, "id": rid})["body"]
    assert body == NOTE  # the record keeps the file's text, front matter included

    def check(hits: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        assert hits and hits[0]["record_id"] == rid
        for h in hits:
            no_front_matter(h["text"])
            assert body.encode("utf-8")[h["start"] : h["end"]].decode("utf-8") == h["text"]
        assert hits[0]["start"] == len(FRONT.encode("utf-8")) and hits[0]["text"].startswith("# 旅行计划")
        return [(h["record_id"], h["start"], h["end"], h["text"]) for h in hits]

    found = {q: check(cli_json(d, notes, "rag", "search", vid, q, "--mode", "bm25")["results"]) for q in ("长城", "rain jacket")}
    # Front matter values are searchable through the card's metadata (tags and other keys).
    for q in (CANARY, "travel", "旅行"):
        found[q] = check(d.call("rag.search", {"vault": vid, "query": q, "mode": "bm25"})["results"])
    snippets = d.call("memory.search", {"vault": vid, "query": CANARY})["results"]
    assert [s["id"] for s in snippets] == [rid]
    no_front_matter(snippets[0]["snippet"])
    pack = d.call("rag.context", {"vault": vid, "query": "长城 rain jacket", "mode": "bm25"})
    assert [i["record_id"] for i in pack["items"]] == [rid]
    no_front_matter(pack["text"])
    # `rag ask`: the sources sent to the model hold no front matter.
    server.add(CHAT, Scripted.json(200, {"choices": [{"message": {"content": json.dumps({"answer": "Pack a rain jacket [S1].", "citations": ["S1"]})}}]}))
    ask = cli_json(d, notes, "rag", "ask", vid, "rain jacket", "--mode", "bm25")
    assert ask["status"] == "answered" and ask["citations"][0]["record_id"] == rid
    assert ask["citations"][0]["start"] == len(FRONT.encode("utf-8"))
    sent = json.dumps([json.loads(s.body) for s in server.seen(CHAT)], ensure_ascii=False)
    assert "长城" in sent and CANARY not in sent and "reviewer" not in sent
    # The lexical snapshot restores the same fragments from their byte ranges after lock and unlock.
    d.call("vault.lock", {"vault": vid})
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    again = {q: check(d.call("rag.search", {"vault": vid, "query": q, "mode": "bm25"})["results"]) for q in found}
    assert again == found
    assert "lexical index restored from its sealed snapshot" in d.log_text()


def test_two_notes_of_the_same_name_have_distinct_absolute_sources(env: tuple[Daemon, str, Path], server: Mirror) -> None:
    d, vid, notes = env
    for folder, line in (("work", "Send the quarterly zeppelin report."), ("home", "Water the zeppelin ferns.")):
        (notes / folder).mkdir()
        (notes / folder / "todo.md").write_text(f"# todo\n\n{line}\n")
    cli_json(d, notes, "rag", "ingest", vid, ".", "--recursive")
    want = {real(notes / "work" / "todo.md"), real(notes / "home" / "todo.md")}
    hits = cli_json(d, notes, "rag", "search", vid, "zeppelin", "--mode", "bm25")["results"]
    assert {h["source"] for h in hits} == want
    assert {r["source"] for r in d.call("memory.search", {"vault": vid, "query": "zeppelin"})["results"]} == want
    pack = d.call("rag.context", {"vault": vid, "query": "zeppelin", "mode": "bm25"})
    assert {i["source"] for i in pack["items"]} == want
    # Text output: the same paths, with the home directory shown as ~.
    server.add(CHAT, Scripted.json(200, {"choices": [{"message": {"content": json.dumps({"answer": "Both [S1][S2].", "citations": ["S1", "S2"]})}}]}))
    r = cli(d, notes, "rag", "ask", vid, "zeppelin", "--mode", "bm25", env={"HOME": os.path.realpath(notes), "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "~/work/todo.md" in r.stdout and "~/home/todo.md" in r.stdout, r.stdout


def test_reingest_from_another_working_directory_updates_the_same_card(env: tuple[Daemon, str, Path]) -> None:
    d, vid, notes = env
    (notes / "work").mkdir()
    todo = notes / "work" / "todo.md"
    todo.write_text("# todo\n\nBook the dentist.\n")
    first = cli_json(d, notes / "work", "rag", "ingest", vid, "todo.md")
    assert first["added"] == 1 and first["records"][0]["source"] == real(todo)
    rid = first["records"][0]["id"]
    same = cli_json(d, notes, "rag", "ingest", vid, "work/todo.md")
    assert (same["added"], same["updated"], same["unchanged"]) == (0, 0, 1)
    todo.write_text("# todo\n\nBook the dentist. Renew the passport.\n")
    changed = cli_json(d, notes.parent, "rag", "ingest", vid, os.path.join(notes.name, "work", ".", "todo.md"))
    assert (changed["added"], changed["updated"]) == (0, 1) and changed["records"][0]["id"] == rid
    cards = d.call("memory.list", {"vault": vid, "kind": "card"})["records"]
    assert [c["id"] for c in cards] == [rid]
    hit = d.call("rag.search", {"vault": vid, "query": "passport", "mode": "bm25"})["results"][0]
    assert hit["record_id"] == rid and hit["revision"] == 2 and hit["source"] == real(todo)
