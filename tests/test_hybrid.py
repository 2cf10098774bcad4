"""Hybrid search and reranking through the real daemon."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from .conftest import (
    SHARED,
    Daemon,
    DaemonError,
    cli_json,
    create_vault,
    needs_shared,
    run_cli,
    short_tmpdir,
    write_config,
)
from .servers import Mirror, Scripted
from .tinymodel import make_tiny_model

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
RERANK = "/v1/rerank"


@pytest.mark.skipif(not MINILM.is_dir(), reason=needs_shared("models/all-MiniLM-L6-v2-onnx"))
def test_hybrid_finds_what_bm25_and_vector_each_miss() -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n')
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        ids = {}
        for title, body in [
            ("form", "Bring the zx81-form to the front desk before noon."),
            ("puppy", "My puppy has a checkup with the animal doctor next week."),
            ("clinic", "Dogs at the clinic get their vaccines and a health exam."),
            ("hospital", "The pet hospital treats sick dogs and cats."),
            ("visit", "Schedule a visit for the dog at the animal clinic."),
            ("taxes", "File the quarterly tax return online."),
            ("garden", "Water the tomatoes twice a week in summer."),
        ]:
            ids[title] = d.call("memory.add", {"vault": vid, "title": "", "body": body})["id"]
        q = "canine veterinarian appointment zx81-form"
        top = lambda mode: [r["record_id"] for r in d.call("rag.search", {"vault": vid, "query": q, "mode": mode, "limit": 2})["results"]]  # noqa: E731
        bm25, vector, hybrid = top("bm25"), top("vector"), top("hybrid")
        # BM25 finds only the exact identifier; vectors find the dog-doctor notes but not the form.
        assert bm25 == [ids["form"]]
        assert ids["form"] not in vector and vector[0] not in bm25
        assert set(hybrid) == {ids["form"], vector[0]}
        res = d.call("rag.search", {"vault": vid, "query": q, "mode": "hybrid", "limit": 2, "no_rerank": True})["results"]
        form = next(r for r in res if r["record_id"] == ids["form"])
        assert form["bm25_rank"] == 1 and form["vector_rank"] is not None
        # Default fusion (convex, MiniLM's weight 1): BM25's only hit scores 1 on its side, the vector side is the
        # cosine min-max normalised over the vector candidates (every fragment here: the floor applies after fusion).
        cos = [r["cosine"] for r in d.call("rag.search", {"vault": vid, "query": q, "mode": "vector", "limit": 100, "min_score": -1})["results"]]
        expect = (1.0 + (form["cosine"] - min(cos)) / (max(cos) - min(cos))) / 2
        assert form["fused_score"] == pytest.approx(expect, abs=1e-5)
        rrf = d.call("rag.search", {"vault": vid, "query": q, "mode": "hybrid", "limit": 2, "no_rerank": True, "fusion": "rrf"})["results"]
        form = next(r for r in rrf if r["record_id"] == ids["form"])
        assert form["fused_score"] == pytest.approx(1 / 61 + 1 / (60 + form["vector_rank"]), rel=1e-4)
        # Paraphrase ranks above unrelated text with the real model.
        vec = d.call("rag.search", {"vault": vid, "query": "vet visit for my dog", "mode": "vector", "limit": 5})["results"]
        order = [r["record_id"] for r in vec]
        assert ids["puppy"] in order and ids["taxes"] not in order  # unrelated text is under MiniLM's floor (0.25)
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def rerank_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Mirror, str]]:
    model = tmp_path_factory.mktemp("m") / "tiny"
    make_tiny_model(model, seed=3)
    with Mirror() as server:
        root = short_tmpdir()
        home = root / "h"
        write_config(
            home,
            # min_cosine = -1: no relevance floor, so every candidate goes to the rerank service
            f'[embedding.local]\nmodel_dir = "{model}"\n[search]\nmin_cosine = -1\n'
            f'[rerank]\nprotocol = "compatible"\nurl = "{server.url}{RERANK}"\nmodel = "rr"\n'
            "[http]\nretries = 0\n",
        )
        d = Daemon(home).start()
        vid = create_vault(d)
        for body in ("dog cat pet", "dog vet food", "coffee milk", "mountain trail"):
            d.call("memory.add", {"vault": vid, "body": body})
        yield d, server, vid
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _n_docs(server: Mirror) -> int:
    return len(json.loads(server.seen(RERANK)[-1].body)["documents"])


def test_remote_reranker_reorders_with_valid_scores(rerank_env: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = rerank_env
    d.call("rag.index", {"vault": vid})
    # First find out how many candidates are sent, then script scores that reverse the order.
    server.add(RERANK, Scripted.json(200, {"results": [{"index": i, "relevance_score": 0.1} for i in range(4)]}))
    first = d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})["results"]
    n = _n_docs(server)
    sent = json.loads(server.seen(RERANK)[-1].body)
    assert sent["top_n"] == n and sent["model"] == "rr" and sent["query"] == "dog"
    scores = [{"index": i, "relevance_score": float(i)} for i in range(n)]
    server.add(RERANK, Scripted.json(200, {"results": scores}))
    again = d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})["results"]
    assert [r["text"] for r in again] == [r["text"] for r in first][::-1][: len(again)]
    assert again[0]["score"] == float(n - 1)


@pytest.mark.parametrize(
    "results,why",
    [
        (lambda n: [{"index": 0, "relevance_score": 1.0}] * n, "twice"),
        (lambda n: [{"index": i, "relevance_score": 1.0} for i in range(n - 1)], "no score"),
        (lambda n: [{"index": i + 1, "relevance_score": 1.0} for i in range(n)], "range"),
        (lambda n: [{"index": i, "relevance_score": "NaN"} for i in range(n)], "number"),
    ],
)
def test_bad_reranker_answers_fail_the_search_clearly(rerank_env: tuple[Daemon, Mirror, str], results: object, why: str) -> None:
    d, server, vid = rerank_env
    d.call("rag.index", {"vault": vid})
    server.add(RERANK, Scripted.json(200, {"results": [{"index": i, "relevance_score": 0.0} for i in range(4)]}))
    d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})
    n = _n_docs(server)
    server.add(RERANK, Scripted.json(200, {"results": results(n)}))  # type: ignore[operator]
    with pytest.raises(DaemonError) as ei:
        d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})
    assert ei.value.code == "rerank_failed" and why in ei.value.message


def test_nan_score_in_json_is_refused(rerank_env: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = rerank_env
    d.call("rag.index", {"vault": vid})
    server.add(RERANK, Scripted.json(200, {"results": [{"index": i, "relevance_score": 0.0} for i in range(4)]}))
    d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})
    n = _n_docs(server)
    body = "{\"results\": [" + ", ".join(f'{{"index": {i}, "relevance_score": NaN}}' for i in range(n)) + "]}"
    server.add(RERANK, Scripted(status=200, headers={"Content-Type": "application/json"}, body=body.encode()))
    with pytest.raises(DaemonError) as ei:
        d.call("rag.search", {"vault": vid, "query": "dog", "mode": "hybrid"})
    assert ei.value.code in ("rerank_failed", "invalid_model_output")


def test_no_rerank_really_skips_the_service(rerank_env: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = rerank_env
    out = cli_json(d.home, "rag", "search", vid, "dog", "--mode", "hybrid", "--no-rerank")
    assert out["mode"] == "hybrid" and out["results"]
    assert server.seen(RERANK) == []
    assert run_cli(d.home, "rag", "search", vid, "dog", "--mode", "bm25").returncode == 0
    assert server.seen(RERANK) == []  # bm25 mode never reranks


def test_default_mode_is_hybrid_once_a_model_is_available(rerank_env: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = rerank_env
    server.add(RERANK, Scripted.json(200, {"results": [{"index": i, "relevance_score": 1.0 - i / 10} for i in range(4)]}))
    out = cli_json(d.home, "rag", "search", vid, "dog", "--no-rerank")
    assert out["mode"] == "hybrid"
