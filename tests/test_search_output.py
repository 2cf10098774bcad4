"""`rag search --fragments` shows each fragment's fingerprint; `memory search --limit N` and `rag search --limit N` give N records.

A real memoriesd on a temp home, driven by the real CLI (and a grant over the real protocol).
Long records whose every fragment matches densely fill the first BM25 fragments, so grouping only
those by record would return fewer records than asked for although more match.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import Daemon, cli_json, create_vault, run_cli, running_daemon

WIDE = {"COLUMNS": "250"}


def dense(n: int, sentences: int = 700) -> str:
    """About 30k characters (some 45 fragments), "zebra" three times in every sentence."""
    return "".join(f"Zebra herd {n} zebra stripes zebra number {j}. " for j in range(sentences))


@dataclass
class Vault:
    d: Daemon
    vid: str
    long_notes: list[str]
    short_notes: list[str]
    private: str
    long_cards: list[str]
    short_cards: list[str]

    @property
    def visible(self) -> set[str]:
        return {*self.long_notes, *self.short_notes, *self.long_cards, *self.short_cards}


@pytest.fixture(scope="module")
def vault() -> Iterator[Vault]:
    with running_daemon() as d:
        vid = create_vault(d)

        def add(**kw: Any) -> str:
            return str(d.call("memory.add", {"vault": vid, **kw})["id"])

        def card(title: str, text: str) -> str:
            d.call("rag.ingest", {"vault": vid, "text": text, "title": title})
            return next(r["id"] for r in d.call("memory.list", {"vault": vid})["records"] if r["title"] == title)

        long_notes = [add(title=f"Zebra field log {i}", body=dense(i)) for i in range(3)]
        short_notes = [add(title=f"Short note {i}", body=f"Note {i} mentions a zebra once, among other words.") for i in range(8)]
        private = add(title="Zebra diary", body=dense(99), private=True)
        long_cards = [card(f"Zebra card {i}", dense(10 + i)) for i in range(2)]
        short_cards = [card(f"Small card {i}", f"Card {i}: a zebra, seen once at the river.") for i in range(5)]
        yield Vault(d, vid, long_notes, short_notes, private, long_cards, short_cards)


def test_the_long_records_fill_the_first_hundred_fragments(vault: Vault) -> None:
    """The premise of the tests below: the top 100 fragments come from only a few records."""
    out = cli_json(vault.d.home, "rag", "search", vault.vid, "zebra", "--mode", "bm25", "--limit", "100", "--fragments")
    assert len(out["results"]) == 100
    assert {r["record_id"] for r in out["results"]} <= {*vault.long_notes, *vault.long_cards}


@pytest.mark.parametrize("limit", [4, 8, 12])
def test_memory_search_limit_n_gives_n_distinct_records(vault: Vault, limit: int) -> None:
    out = cli_json(vault.d.home, "memory", "search", vault.vid, "zebra", "--limit", str(limit))
    ids = [r["id"] for r in out["results"]]
    assert len(ids) == limit and len(set(ids)) == limit
    assert set(ids) <= vault.visible
    scores = [r["score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True)


def test_memory_search_human_output_has_one_line_per_record(vault: Vault) -> None:
    ids = [r["id"] for r in cli_json(vault.d.home, "memory", "search", vault.vid, "zebra", "--limit", "10")["results"]]
    r = run_cli(vault.d.home, "memory", "search", vault.vid, "zebra", "--limit", "10", env=WIDE)
    assert r.returncode == 0, r.stderr
    assert len(ids) == 10
    for rid in ids:
        assert r.stdout.count(rid) == 1, rid
    rows = [line for line in r.stdout.splitlines() if any(rid in line for rid in ids)]
    assert len(rows) == 10


def test_memory_search_returns_every_matching_record_when_fewer_than_the_limit(vault: Vault) -> None:
    out = cli_json(vault.d.home, "memory", "search", vault.vid, "zebra", "--limit", "50")
    ids = [r["id"] for r in out["results"]]
    assert len(ids) == len(set(ids)) and set(ids) == vault.visible  # all 18; never the private one
    phrase = cli_json(vault.d.home, "memory", "search", vault.vid, "zebra stripes", "--match-mode", "phrase", "--limit", "50")
    assert {r["id"] for r in phrase["results"]} == {*vault.long_notes, *vault.long_cards}


def test_memory_search_cards_only_widens_too(vault: Vault) -> None:
    out = cli_json(vault.d.home, "memory", "search", vault.vid, "zebra", "--cards-only", "--limit", "6")
    ids = [r["id"] for r in out["results"]]
    assert len(set(ids)) == 6 and set(ids) <= {*vault.long_cards, *vault.short_cards}


def test_a_grant_scoped_search_gives_n_visible_records(vault: Vault) -> None:
    d = vault.d
    for kw, limit, allowed in (
        ({}, 9, vault.visible),
        ({"cards_only": True}, 7, {*vault.long_cards, *vault.short_cards}),
    ):
        token = d.call("grant.create", {"vault": vault.vid, "scopes": ["search"], **kw})["token"]
        s = d.connect(token=token)
        try:
            assert "result" in d.request("session.grant", {"token": token}, sock=s)
            msg = d.request("memory.search", {"query": "zebra", "limit": limit}, sock=s)
        finally:
            s.close()
        assert "error" not in msg, msg
        ids = [r["id"] for r in msg["result"]["results"]]
        assert len(ids) == limit and len(set(ids)) == limit, kw
        assert set(ids) <= allowed and vault.private not in ids


def test_rag_search_verbose_shows_each_fragments_fingerprint_record_and_bytes(vault: Vault) -> None:
    args = ("rag", "search", vault.vid, "zebra", "--mode", "bm25", "--limit", "5")
    results = cli_json(vault.d.home, *args)["results"]
    assert len(results) == 5
    plain = run_cli(vault.d.home, *args, env=WIDE)
    assert plain.returncode == 0, plain.stderr
    r = run_cli(vault.d.home, *args, "--verbose", env=WIDE)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.rstrip("\n").split("\n\n")
    assert len(blocks) == 5
    for res, block in zip(results, blocks, strict=True):
        assert re.fullmatch(r"[0-9a-f]{32}", res["fingerprint"])
        assert block.startswith(f"[{res['label']}] ")
        assert f"fingerprint {res['fingerprint'][:12]}" in block and res["fingerprint"][:12] not in plain.stdout
        assert f"record {res['record_id']}@{res['revision']}" in block
        assert f"bytes {res['start']}-{res['end']}" in block and f"score {res['score']:.4f}" in block


@pytest.mark.parametrize("limit", [4, 12])
def test_rag_search_limit_n_gives_n_documents_past_the_long_records(vault: Vault, limit: int) -> None:
    """One hit per document: the candidates are widened past the long records' hundred fragments."""
    out = cli_json(vault.d.home, "rag", "search", vault.vid, "zebra", "--mode", "bm25", "--limit", str(limit))
    ids = [r["record_id"] for r in out["results"]]
    assert out["grouping"] == "document"
    assert len(ids) == limit and len(set(ids)) == limit and set(ids) <= vault.visible


def test_rag_search_gives_every_matching_document_when_fewer_than_the_limit(vault: Vault) -> None:
    out = cli_json(vault.d.home, "rag", "search", vault.vid, "zebra", "--mode", "bm25", "--limit", "50")
    assert sorted(r["record_id"] for r in out["results"]) == sorted(vault.visible)  # never the private one
    long_ones = [r for r in out["results"] if r["record_id"] in {*vault.long_notes, *vault.long_cards}]
    assert long_ones and all(r["more"] >= 1 and r["matches"] == r["more"] + 1 for r in long_ones)
