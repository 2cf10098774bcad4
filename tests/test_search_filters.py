"""`rag search` and `rag context` filters: --kind, --category, --tag, --since/--until.

A real memoriesd on a temp home, embeddings from a real loopback service (tests/embed_server.py), so
the filters are seen on both sides: BM25 candidates and vector candidates, in each mode.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, DaemonError, create_vault, run_cli, short_tmpdir, write_config
from .embed_server import EmbeddingService

MODES = ("bm25", "vector", "hybrid")


@dataclass
class Env:
    d: Daemon
    vid: str
    ids: dict[str, str]
    root: Path


def _card(d: Daemon, vid: str, title: str, text: str, tags: list[str] | None = None) -> str:
    out = d.call("rag.ingest", {"vault": vid, "text": text, "title": title, "tags": tags or []})
    return str(out["records"][0]["id"])


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    svc = EmbeddingService()
    root = short_tmpdir("mf")
    home = root / "h"
    write_config(home, svc.config() + "[search]\non_demand_embed_limit = 5000\n")
    d = Daemon(home).start()
    try:
        vid = create_vault(d, "filters")
        ids = {
            "old_card": _card(d, vid, "Orchard 2021", "---\ndate: 2021-03-04\n---\nThe orchard apples were picked early.", ["garden"]),
            "new_card": _card(d, vid, "Orchard 2023", "---\ndate: 2023-07-01T09:30:00\n---\nThe orchard pears ripened in July.", ["garden", "Spring"]),
            "note": d.call("memory.add", {"vault": vid, "title": "Orchard plan", "body": "Plant more orchard trees next autumn.", "tags": ["spring"]})["id"],
            "pref": d.call("memory.remember", {"vault": vid, "text": "The user prefers pear trees in the orchard.", "category": "preference"})["id"],
            "profile": d.call("memory.remember", {"vault": vid, "text": "The user owns an orchard near Lyon.", "category": "profile"})["id"],
            "decision": d.call("memory.remember", {"vault": vid, "text": "The user decided to sell the orchard apples.", "category": "decision"})["id"],
        }
        yield Env(d, vid, ids, root)
    finally:
        d.stop()
        svc.close()
        shutil.rmtree(root, ignore_errors=True)


def found(e: Env, query: str, mode: str, **filters: Any) -> list[str]:
    out = e.d.call("rag.search", {"vault": e.vid, "query": query, "mode": mode, "limit": 50, **filters})
    assert out["mode"] == mode
    return list(dict.fromkeys(r["record_id"] for r in out["results"]))


def test_kind_keeps_only_records_of_that_kind_in_every_mode(env: Env) -> None:
    i = env.ids
    facts = {i["pref"], i["profile"], i["decision"]}
    for mode in MODES:
        assert set(found(env, "orchard", mode)) == {*facts, i["old_card"], i["new_card"], i["note"]}, mode
        assert set(found(env, "orchard", mode, kinds=["fact"])) == facts, mode
        assert set(found(env, "orchard", mode, kinds=["card", "memory"])) == {i["old_card"], i["new_card"], i["note"]}, mode


def test_category_keeps_facts_of_those_categories(env: Env) -> None:
    i = env.ids
    for mode in MODES:
        assert found(env, "orchard", mode, categories=["preference"]) == [i["pref"]], mode
        assert set(found(env, "orchard", mode, categories=["profile", "decision"], kinds=["fact"])) == {i["profile"], i["decision"]}
    with pytest.raises(DaemonError) as bad:
        env.d.call("rag.search", {"vault": env.vid, "query": "orchard", "kinds": ["card"], "categories": ["preference"]})
    assert bad.value.code == "query_invalid" and "--category selects facts" in bad.value.message


def test_tags_must_all_be_present_whatever_their_case(env: Env) -> None:
    i = env.ids
    for mode in MODES:
        assert set(found(env, "orchard", mode, tags=["garden"])) == {i["old_card"], i["new_card"]}, mode
        assert found(env, "orchard", mode, tags=["GARDEN", "spring"]) == [i["new_card"]], mode
        assert set(found(env, "orchard", mode, tags=["Spring"])) == {i["new_card"], i["note"]}, mode


def test_since_and_until_use_the_front_matter_date_else_the_creation_day(env: Env) -> None:
    i = env.ids
    today = date.today().isoformat()
    everything_today = {i["note"], i["pref"], i["profile"], i["decision"]}
    for mode in MODES:
        assert found(env, "orchard", mode, since="2022-01-01", until="2023-12-31") == [i["new_card"]], mode
        assert found(env, "orchard", mode, until="2021-03-04") == [i["old_card"]], mode  # both ends included
        assert set(found(env, "orchard", mode, since=today)) == everything_today, mode
    for bad, message in (({"since": "yesterday"}, "--since takes an ISO date"), ({"until": "2024-02-30"}, "--until takes an ISO date"),
                         ({"since": "2024-05-02", "until": "2024-05-01"}, "is after --until")):
        with pytest.raises(DaemonError) as err:
            env.d.call("rag.search", {"vault": env.vid, "query": "orchard", **bad})
        assert err.value.code == "query_invalid" and message in err.value.message


def test_the_cli_passes_every_filter_and_refuses_a_bad_date_in_one_line(env: Env) -> None:
    r = run_cli(env.d.home, "--json", "rag", "search", env.vid, "orchard", "--kind", "card", "--tag", "garden", "--since", "2023-01-01")
    assert r.returncode == 0, r.stderr
    assert [x["record_id"] for x in json.loads(r.stdout)["results"]] == [env.ids["new_card"]]
    bad = run_cli(env.d.home, "rag", "search", env.vid, "orchard", "--until", "31/12/2023")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "ISO date like 2024-05-31" in bad.stderr


CHUNK = "compost compost compost heap compost turning. " * 20 + "\n"
SHED = "The shed roof leaks; a little compost sits by the door, with tools and old pots."
# Once "compost" in about 900 characters: every fragment of it ranks below every fragment of CHUNK.
WEAK = "compost " + " ".join(f"shed{n} roof door tools pots" for n in range(30)) + "\n"


def _crowded(e: Env, name: str, note_bytes: int, notes: int, rare_body: str = SHED) -> tuple[str, str]:
    """A vault where ``notes`` long notes say "compost" in every fragment, and one rare-tagged note says it less."""
    vid = e.d.call("vault.create", {"name": name, "passphrase": "correct horse"})["vault_id"]
    for n in range(notes):
        e.d.call("memory.add", {"vault": vid, "title": f"Heap {n}", "body": CHUNK * (note_bytes // len(CHUNK))})
    rare = e.d.call("memory.add", {"vault": vid, "title": "Shed", "body": rare_body, "tags": ["rare"]})["id"]
    return vid, rare


def test_a_filtered_record_beyond_the_unfiltered_candidates_is_still_found(env: Env) -> None:
    """A long note says "compost" many times in every fragment; a rare-tagged note about as long says
    it once a line: its fragments rank below the first BM25 candidates (about half the fragments
    pass, so about 400 are taken first, then widened until they are reached) and the first vector
    candidates, and the filter still finds them, in every mode."""
    vid, rare = _crowded(env, "crowded", 650_000, 1, WEAK * 700)
    n = env.d.call("rag.status", {"vault": vid})["fragments"]
    assert n > 1000
    for mode in MODES:
        # min_score -1: the rare note's one "compost" in 900 characters is under the relevance floor in meaning
        # (per fragment: the rare note's own fragments are what the widening must reach)
        out = env.d.call("rag.search", {"vault": vid, "query": "compost", "mode": mode, "limit": 3, "min_score": -1, "fragments": True})
        assert rare not in {r["record_id"] for r in out["results"]}, mode
        out = env.d.call("rag.search", {"vault": vid, "query": "compost", "mode": mode, "limit": 3, "tags": ["rare"], "min_score": -1, "fragments": True})
        assert len(out["results"]) == 3 and {r["record_id"] for r in out["results"]} == {rare}, mode


def test_context_filters_every_item_profile_included(env: Env) -> None:
    i = env.ids
    whole = env.d.call("rag.context", {"vault": env.vid, "query": "orchard"})
    assert {it["record_id"] for it in whole["items"]} >= {i["profile"], i["pref"], i["old_card"]}
    cards = env.d.call("rag.context", {"vault": env.vid, "query": "orchard", "kinds": ["card"]})
    assert {it["record_id"] for it in cards["items"]} == {i["old_card"], i["new_card"]}
    assert not cards["text"].startswith("## About the user")
    profile = env.d.call("rag.context", {"vault": env.vid, "query": "orchard", "categories": ["profile"]})
    assert [it["record_id"] for it in profile["items"]] == [i["profile"]]
    r = run_cli(env.d.home, "rag", "context", env.vid, "orchard", "--tag", "spring", "--until", "2099-01-01")
    assert r.returncode == 0, r.stderr
    assert "Orchard 2023" in r.stdout and "Orchard plan" in r.stdout and "Lyon" not in r.stdout


def test_past_the_bm25_bound_allowed_fragments_that_match_are_still_found(env: Env) -> None:
    """Over 10,000 fragments rank above the rare note: BM25 cannot return it among its candidates, so
    the allowed fragments that match the query are added after them (score 0)."""
    vid, rare = _crowded(env, "huge", 3_500_000, 3)
    assert env.d.call("rag.status", {"vault": vid})["fragments"] > 10_000
    out = env.d.call("rag.search", {"vault": vid, "query": "compost", "mode": "bm25", "limit": 3, "tags": ["rare"]})
    assert [(r["record_id"], r["score"]) for r in out["results"]] == [(rare, 0.0)]
    out = env.d.call("rag.search", {"vault": vid, "query": "orchard", "mode": "bm25", "limit": 3, "tags": ["rare"]})
    assert out["results"] == []  # allowed, but it does not match
