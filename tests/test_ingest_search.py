"""Ingestion and lexical search through the real daemon and CLI (real FTS5, real jieba)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memoriesd.server import protocol

from .conftest import (
    Daemon,
    DaemonError,
    all_file_bytes,
    cli_json,
    create_vault,
    run_cli,
    short_tmpdir,
    write_config,
)

EN = "# Garden notes\n\nTomatoes need full sun and regular watering. Basil grows well beside them.\n"
ZH = "---\ntags: [旅行, travel]\nauthor: 王小明\n---\n# 旅行计划\n\n我们下个月去北京看长城，然后坐高铁去上海。中华人民共和国的首都是北京。\n"


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    d = tmp_path / "notes"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    (d / "garden.md").write_text(EN)
    (d / "sub" / "travel.md").write_text(ZH)
    (d / "sub" / "plain.txt").write_text("no heading here, just local-first words\n")
    (d / ".hidden" / "secret.md").write_text("# Hidden\n\nshould never be ingested\n")
    (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    return d


def test_recursive_ingest_summary_refusals_and_titles(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    (notes / "scan.pdf").write_bytes(b"%PDF-1.7\n" + bytes(50))
    (notes / "bad.md").write_bytes(b"caf\xe9 au lait")
    r = run_cli(daemon.home, "rag", "ingest", vid, str(notes), "--recursive", str(notes / "scan.pdf"), str(notes / "bad.md"), str(notes / "image.png"))
    assert r.returncode == 1, r.stderr
    refused = [ln for ln in r.stderr.splitlines() if ln.startswith("refused:")]
    assert len(refused) == 3
    assert any("scan.pdf" in ln and "convert it to text" in ln for ln in refused)
    assert any("bad.md" in ln and "UTF-8" in ln for ln in refused)
    assert any("image.png" in ln for ln in refused)
    assert "added 3" in r.stderr
    titles = sorted(x["title"] for x in cli_json(daemon.home, "memory", "list", vid)["records"])
    assert titles == ["Garden notes", "plain", "旅行计划"]
    # Nothing half-written for the refused files: exactly the three good cards exist.
    assert len(cli_json(daemon.home, "memory", "list", vid, "--kind", "card")["records"]) == 3


def test_reingest_is_noop_and_changed_file_is_new_revision(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    first = daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    assert first["added"] == 3
    again = daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    assert (again["added"], again["updated"], again["unchanged"]) == (0, 0, 3)
    garden_id = next(r["id"] for r in first["records"] if r["title"] == "Garden notes")
    (notes / "garden.md").write_text(EN + "\nAlso plant marigolds.\n")
    changed = daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    assert (changed["added"], changed["updated"], changed["unchanged"]) == (0, 1, 2)
    rec = daemon.call("memory.read", {"vault": vid, "id": garden_id})
    assert rec["revision"] == 2 and "marigolds" in rec["body"]
    assert rec["meta"]["source"] == str((notes / "garden.md").resolve())
    hits = daemon.call("rag.search", {"vault": vid, "query": "marigolds"})["results"]
    assert [h["record_id"] for h in hits] == [garden_id] and hits[0]["revision"] == 2


def test_prune_removes_cards_of_deleted_files(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    (notes / "sub" / "plain.txt").unlink()
    out = daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True, "prune": True})
    assert out["pruned"] == 1
    assert sorted(r["title"] for r in daemon.call("memory.list", {"vault": vid})["records"]) == ["Garden notes", "旅行计划"]


def test_stdin_needs_title_and_is_never_deduplicated(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    r = run_cli(daemon.home, "rag", "ingest", vid, "-", input="some text\n")
    assert r.returncode == 2 and "--title" in r.stderr
    for _ in range(2):
        r = run_cli(daemon.home, "rag", "ingest", vid, "-", "--title", "Piped", "--tag", "p", input="piped words here\n")
        assert r.returncode == 0, r.stderr
    recs = cli_json(daemon.home, "memory", "list", vid)["records"]
    assert [x["title"] for x in recs] == ["Piped", "Piped"] and recs[0]["tags"] == ["p"]


def test_front_matter_becomes_safe_metadata_and_is_searchable(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes / "sub" / "travel.md")]})
    rec = daemon.call("memory.list", {"vault": vid})["records"][0]
    assert rec["tags"] == ["旅行", "travel"]
    full = daemon.call("memory.read", {"vault": vid, "id": rec["id"]})
    assert full["meta"]["author"] == "王小明"
    assert daemon.call("rag.search", {"vault": vid, "query": "王小明"})["results"][0]["record_id"] == rec["id"]


def test_chinese_and_english_search_with_byte_offsets(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    for query, title in (("长城", "旅行计划"), ("高铁", "旅行计划"), ("人民共和国", "旅行计划"), ("watering tomatoes", "Garden notes")):
        res = cli_json(daemon.home, "rag", "search", vid, query)
        assert res["mode"] == "bm25"
        top = res["results"][0]
        assert top["title"] == title and top["label"] == "S1"
        body = daemon.call("memory.read", {"vault": vid, "id": top["record_id"]})["body"]
        assert body.encode("utf-8")[top["start"] : top["end"]].decode("utf-8") == top["text"]
        assert set(top) >= {"label", "record_id", "revision", "title", "fingerprint", "start", "end", "score", "text", "source"}
    assert cli_json(daemon.home, "rag", "search", vid, "长城")["results"][0]["source"] == str((notes / "sub" / "travel.md").resolve())


def test_match_modes_through_the_daemon(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    a = daemon.call("memory.add", {"vault": vid, "body": "the red fox jumps over the lazy dog", "title": "a"})["id"]
    b = daemon.call("memory.add", {"vault": vid, "body": "a red car and a lazy afternoon", "title": "b"})["id"]
    any_ids = {h["record_id"] for h in daemon.call("rag.search", {"vault": vid, "query": "fox car"})["results"]}
    assert any_ids == {a, b}
    all_ids = {h["record_id"] for h in daemon.call("rag.search", {"vault": vid, "query": "red lazy fox", "match_mode": "all"})["results"]}
    assert all_ids == {a}
    phrase = {h["record_id"] for h in daemon.call("rag.search", {"vault": vid, "query": "lazy dog", "match_mode": "phrase"})["results"]}
    assert phrase == {a}
    assert daemon.call("rag.search", {"vault": vid, "query": "dog lazy", "match_mode": "phrase"})["results"] == []


def test_private_credentials_and_files_are_never_returned(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    daemon.call("memory.add", {"vault": vid, "body": "zebra public note", "title": "pub"})
    daemon.call("memory.add", {"vault": vid, "body": "zebra PRIVATECANARY", "title": "priv", "private": True})
    daemon.call("memory.add", {"vault": vid, "body": "zebra hunter2", "title": "cred zebra", "kind": "credential"})
    daemon.call("memory.add", {"vault": vid, "kind": "file", "data": "emVicmE=", "filename": "zebra.txt", "title": "zebra file"})
    for method_ in ("rag.search", "memory.search"):
        res = daemon.call(method_, {"vault": vid, "query": "zebra"})["results"]
        assert [r["title"] for r in res] == ["pub"]
    # Marking a record private removes it from the index at once.
    rid = daemon.call("memory.list", {"vault": vid})["records"]
    pub = next(r["id"] for r in rid if r["title"] == "pub")
    daemon.call("memory.update", {"vault": vid, "id": pub, "private": True})
    assert daemon.call("rag.search", {"vault": vid, "query": "zebra"})["results"] == []


def test_index_invalidated_after_update_delete_and_lock(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    rid = daemon.call("memory.add", {"vault": vid, "body": "alpha beta"})["id"]
    assert len(daemon.call("rag.search", {"vault": vid, "query": "alpha"})["results"]) == 1
    daemon.call("memory.update", {"vault": vid, "id": rid, "body": "gamma delta"})
    assert daemon.call("rag.search", {"vault": vid, "query": "alpha"})["results"] == []
    assert daemon.call("rag.search", {"vault": vid, "query": "gamma"})["results"][0]["revision"] == 2
    st = daemon.call("rag.status", {"vault": vid})
    assert st["index"] == "built"
    daemon.call("memory.add", {"vault": vid, "body": "epsilon"})
    assert daemon.call("rag.status", {"vault": vid})["index"] == "stale"
    daemon.call("vault.lock", {"vault": vid})
    with pytest.raises(DaemonError) as ei:
        daemon.call("rag.search", {"vault": vid, "query": "gamma"})
    assert ei.value.code == "vault_locked"
    daemon.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    st = daemon.call("rag.status", {"vault": vid})
    # Lock dropped it; unlock restores it from the sealed snapshot in the background ("built" once
    # restored), and status never builds it itself.
    assert st["fragments"] == 2 and st["index"] in ("none", "built")
    daemon.call("memory.delete", {"vault": vid, "id": rid})
    assert daemon.call("rag.search", {"vault": vid, "query": "gamma"})["results"] == []


def test_cap_errors_name_the_cap_size_and_key() -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, "[index]\nmax_fragments = 3\n")
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        for i in range(4):
            d.call("memory.add", {"vault": vid, "body": f"note number {i}"})
        with pytest.raises(DaemonError) as ei:
            d.call("rag.search", {"vault": vid, "query": "note"})
        assert ei.value.code == "cap_exceeded"
        assert "4 fragments" in ei.value.message and "max_fragments" in ei.value.message and "3" in ei.value.message
        r = run_cli(home, "rag", "search", vid, "note")
        assert r.returncode == 1 and r.stderr.count("\n") == 1
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_query_limits_and_errors_are_clear(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    daemon.call("memory.add", {"vault": vid, "body": "hello world"})
    for params, code in (
        ({"query": ""}, "query_invalid"),
        ({"query": "!!! ???"}, "query_invalid"),
        ({"query": "x" * 2000}, "query_invalid"),
        ({"query": "hello", "limit": 0}, "query_invalid"),
        ({"query": "hello", "limit": 101}, "query_invalid"),
        ({"query": "hello", "mode": "vector"}, "model_unavailable"),
        ({"query": "hello", "match_mode": "fuzzy"}, "invalid_params"),
    ):
        with pytest.raises(DaemonError) as ei:
            daemon.call("rag.search", {"vault": vid, **params})
        assert ei.value.code == code, (params, ei.value)
    res = daemon.call("rag.search", {"vault": vid, "query": " ".join(f"w{i}" for i in range(200)) + " hello"})
    assert res["ignored_terms"] > 0
    r = run_cli(daemon.home, "rag", "search", vid, "hello", "--mode", "vector")
    assert r.returncode == 1 and "model-install" in r.stderr


def test_memory_search_groups_by_document(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    long_body = ("Kiwi birds are flightless. " * 60) + "\n\n" + ("Kiwi fruit is green. " * 60)
    daemon.call("memory.add", {"vault": vid, "body": long_body, "title": "kiwis"})
    daemon.call("memory.add", {"vault": vid, "body": "one more kiwi", "title": "short"})
    frags = daemon.call("rag.search", {"vault": vid, "query": "kiwi", "fragments": True})["results"]
    assert len(frags) > 2
    docs = cli_json(daemon.home, "memory", "search", vid, "kiwi")["results"]
    assert sorted(d["title"] for d in docs) == ["kiwis", "short"]
    assert all(set(d) >= {"id", "revision", "title", "score", "snippet"} for d in docs)


def test_interrupted_ingest_keeps_every_reported_file_and_no_partial_card(daemon: Daemon, tmp_path: Path) -> None:
    vid = create_vault(daemon)
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(600):
        (folder / f"n{i:04d}.md").write_text(f"# Note {i}\n\n" + ("lorem ipsum dolor sit amet " * 40) + f"\nend-{i}\n")
    s = daemon.connect(vid)
    s.sendall(protocol.encode({"id": 1, "method": "rag.ingest", "params": {"vault": vid, "paths": [str(folder)], "recursive": True}}))
    reported: list[str] = []
    while not reported:
        msg = protocol.recv_frame(s)
        assert "progress" in msg, msg
        reported.extend(msg["progress"].get("durable", []))
    s.close()  # Ctrl-C: the client goes away mid-ingest
    daemon.kill9()
    d = Daemon(daemon.home).start()
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        recs = d.call("memory.list", {"vault": vid})["records"]
        titles = {r["title"] for r in recs}
        for name in reported:
            assert f"Note {int(name[1:5])}" in titles
        assert len(recs) < 600  # it really was interrupted
        for r in recs[:50]:
            body = d.call("memory.read", {"vault": vid, "id": r["id"]})["body"]
            i = int(r["title"].split()[1])
            assert body.endswith(f"end-{i}\n")  # whole, never partial
    finally:
        d.stop()


def test_canary_never_on_disk_after_ingest_and_search(daemon: Daemon, notes: Path) -> None:
    vid = create_vault(daemon)
    (notes / "canary.md").write_text("# CANARYTITLE\n\nCANARYBODY 机密金丝雀 text\n")
    daemon.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
    daemon.call("rag.search", {"vault": vid, "query": "CANARYBODY"})
    daemon.call("memory.search", {"vault": vid, "query": "机密"})
    daemon.call("rag.status", {"vault": vid})
    for path, data in all_file_bytes(daemon.home):
        for c in ("CANARYBODY", "CANARYTITLE", "机密金丝雀", "garden", "Tomatoes"):
            assert c.encode("utf-8") not in data, (path, c)
    assert json.dumps(daemon.call("vault.status", {"vault": vid}))  # still serving


def test_title_only_record_is_found_by_its_title(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    rid = daemon.call("memory.add", {"vault": vid, "title": "Dentist appointment Tuesday", "body": ""})["id"]
    hits = daemon.call("rag.search", {"vault": vid, "query": "dentist"})["results"]
    assert [h["record_id"] for h in hits] == [rid] and hits[0]["text"] == "" and hits[0]["start"] == hits[0]["end"] == 0


def test_status_over_cap_says_which_cap_instead_of_failing() -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, "[index]\nmax_fragments = 1\n")
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        for i in range(2):
            d.call("memory.add", {"vault": vid, "body": f"note {i}"})
        st = d.call("rag.status", {"vault": vid})
        assert st["index"] == "over_cap" and "max_fragments" in st["cap_error"] and st["documents"] == 0 and st["fragments"] == 2
        assert str(home / "config.toml") in st["cap_error"] and "memories daemon restart" in st["cap_error"]
        r = run_cli(home, "rag", "status", vid)
        assert r.returncode == 0 and "max_fragments" in r.stderr
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_jieba_cache_lives_in_the_private_home_cache(daemon: Daemon) -> None:
    import tempfile

    vid = create_vault(daemon)
    daemon.call("memory.add", {"vault": vid, "body": "我们去北京"})
    assert daemon.call("rag.search", {"vault": vid, "query": "北京"})["results"]
    private = daemon.home / "cache" / "jieba"
    assert (private / "jieba.cache").is_file()
    assert (private.stat().st_mode & 0o777) == 0o700
    assert not (Path(tempfile.gettempdir()) / "jieba.cache").exists()
