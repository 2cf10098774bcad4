"""Relevance that can say "nothing": vector and hybrid search apply the model's cosine floor by default.

Real daemon, real all-MiniLM-L6-v2 (its calibrated floor: 0.25, as for `rag ask`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (
    SHARED,
    Daemon,
    cli_json,
    create_vault,
    needs_shared,
    run_cli,
    short_tmpdir,
    write_config,
)

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
GIBBERISH = "zzqxv nonexistentword"
NOTES = [
    ("form", "Bring the signed form to the front desk before noon."),
    ("puppy", "My puppy has a checkup with the animal doctor next week."),
    ("clinic", "Dogs at the clinic get their vaccines and a health exam."),
    ("taxes", "File the quarterly tax return online."),
    ("garden", "Water the tomatoes twice a week in summer."),
]

pytestmark = pytest.mark.skipif(not MINILM.is_dir(), reason=needs_shared("models/all-MiniLM-L6-v2-onnx"))


@pytest.fixture(scope="module")
def vault() -> Iterator[tuple[Daemon, str, dict[str, str]]]:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n')
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        ids = {t: d.call("memory.add", {"vault": vid, "title": "", "body": b})["id"] for t, b in NOTES}
        yield d, vid, ids
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _search(d: Daemon, vid: str, query: str, **params: Any) -> dict[str, Any]:
    out: dict[str, Any] = d.call("rag.search", {"vault": vid, "query": query, **params})
    return out


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
def test_gibberish_finds_nothing_and_says_the_floor_is_why(vault: tuple[Daemon, str, dict[str, str]], mode: str) -> None:
    d, vid, _ = vault
    out = _search(d, vid, GIBBERISH, mode=mode)
    assert out["results"] == []
    assert any("floor" in n and "0.25" in n and "--min-score -1" in n for n in out["notices"]), out["notices"]


def test_cli_says_nothing_relevant_found_and_exits_0(vault: tuple[Daemon, str, dict[str, str]]) -> None:
    d, vid, _ = vault
    r = run_cli(d.home, "rag", "search", vid, GIBBERISH)
    assert r.returncode == 0, r.stderr
    assert "nothing relevant found" in r.stdout + r.stderr and "0.25" in r.stdout + r.stderr
    assert "1.0000" not in r.stdout
    js = cli_json(d.home, "rag", "search", vid, GIBBERISH)
    assert js["mode"] == "hybrid" and js["results"] == [] and js["notices"]


def test_a_real_query_still_finds_its_note(vault: tuple[Daemon, str, dict[str, str]]) -> None:
    d, vid, ids = vault
    for mode in ("hybrid", "vector"):
        out = _search(d, vid, "vet visit for my dog", mode=mode)
        assert out["results"] and out["results"][0]["record_id"] in (ids["puppy"], ids["clinic"])
        assert all(r["cosine"] >= 0.25 or r.get("bm25_rank") for r in out["results"])  # each a match in words or meaning
        assert not out["notices"]


def test_a_lexical_match_is_kept_whatever_its_cosine(vault: tuple[Daemon, str, dict[str, str]]) -> None:
    """Hybrid keeps a candidate that BM25 found even when its cosine is under the floor."""
    d, vid, ids = vault
    q = "desk zzqxv"  # the form note: a BM25 hit at cosine 0.22 with MiniLM
    assert _search(d, vid, q, mode="vector")["results"] == []  # nothing close in meaning
    out = _search(d, vid, q, mode="hybrid")
    assert [r["record_id"] for r in out["results"]] == [ids["form"]]
    assert out["results"][0]["bm25_rank"] == 1 and out["results"][0]["cosine"] < 0.25


def test_min_score_minus_one_turns_the_floor_off_and_nothing_scores_as_a_sure_match(vault: tuple[Daemon, str, dict[str, str]]) -> None:
    d, vid, _ = vault
    hybrid = _search(d, vid, GIBBERISH, mode="hybrid", min_score=-1)
    assert len(hybrid["results"]) == len(NOTES) and not hybrid["notices"]
    assert all(r["bm25_rank"] is None for r in hybrid["results"])
    # A candidate only the vector side found scores at most w / (1 + w) = 0.5 (MiniLM's w = 1), never 1.
    assert all(r["fused_score"] <= 0.5 + 1e-6 and r["score"] <= 0.5 + 1e-6 for r in hybrid["results"])
    vector = _search(d, vid, GIBBERISH, mode="vector", min_score=-1)
    assert len(vector["results"]) == len(NOTES)
    assert all(r["score"] == r["cosine"] < 0.25 for r in vector["results"])
    r = run_cli(d.home, "rag", "search", vid, GIBBERISH, "--min-score", "-1")
    assert r.returncode == 0 and "[S5]" in r.stdout and "1.0000" not in r.stdout, r.stdout + r.stderr


def test_mcp_retrieve_keeps_the_floor_and_min_score_minus_one_turns_it_off(vault: tuple[Daemon, str, dict[str, str]]) -> None:
    from mcp.client.session import ClientSession

    from .test_agent_writes import Env as WriteEnv
    from .test_agent_writes import with_mcp

    d, vid, _ = vault
    token = d.call("grant.create", {"vault": vid, "scopes": ["retrieve"]})["token"]

    async def go(s: ClientSession) -> tuple[Any, Any, Any]:
        return (
            await s.call_tool("memory_retrieve", {"query": GIBBERISH}),
            await s.call_tool("memory_retrieve", {"query": GIBBERISH, "min_score": -1}),
            await s.call_tool("memory_retrieve", {"query": GIBBERISH, "min_score": 3}),
        )

    floor, off, bad = with_mcp(WriteEnv(d, None, d.home.parent, vid, "", "", ""), token, go)  # type: ignore[arg-type]
    assert not floor.is_error and floor.structured_content["results"] == []
    assert not off.is_error and len(off.structured_content["results"]) == len(NOTES)
    assert bad.is_error
