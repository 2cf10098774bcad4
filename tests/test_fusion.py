"""Reciprocal rank fusion and the light (heuristic) reranker."""

from __future__ import annotations

import math
import random

import pytest

from memoriesd.rag.fusion import (
    Candidate,
    convex_ranks,
    fuse,
    light_rerank,
    order_by_scores,
    rrf,
    rrf_ranks,
    term_coverage,
)


def test_rrf_scores_match_hand_computed_ranks() -> None:
    bm25 = [10, 20, 30]
    vec = [30, 40, 10]
    got = dict(rrf([bm25, vec], k=60))
    assert got[10] == pytest.approx(1 / 61 + 1 / 63)
    assert got[30] == pytest.approx(1 / 63 + 1 / 61)
    assert got[20] == pytest.approx(1 / 62)
    assert got[40] == pytest.approx(1 / 62)
    assert set(got) == {10, 20, 30, 40}


def test_rrf_orders_by_score_then_best_rank_then_id() -> None:
    # 10 and 30 tie on score (1/61 + 1/63) and on best rank (1); both in two lists -> id decides.
    # 20 and 40 tie on score (1/62) and best rank (2) -> id decides.
    order = [fid for fid, _ in rrf([[10, 20, 30], [30, 40, 10]], k=60)]
    assert order == [10, 30, 20, 40]


def test_rrf_with_small_k_rewards_agreement() -> None:
    # k = 1: a=1/2+1/4 = 0.75 (ranks 1 and 3), b=1/3+1/2 = 0.8333 (ranks 2 and 1), c=1/4+1/3.
    got = rrf([[1, 2, 3], [2, 3, 1]], k=1)
    assert [fid for fid, _ in got] == [2, 1, 3]
    assert got[0][1] == pytest.approx(1 / 3 + 1 / 2)
    assert got[1][1] == pytest.approx(1 / 2 + 1 / 4)
    assert got[2][1] == pytest.approx(1 / 4 + 1 / 3)


def test_rrf_keeps_the_rank_each_candidate_had_in_each_list() -> None:
    fused = {f.frag_id: f.ranks for f in rrf_ranks([[5, 6], [7, 5]], k=60)}
    assert fused == {5: (1, 2), 6: (2, None), 7: (None, 1)}


def test_repeated_id_in_one_list_counts_once_at_its_best_rank() -> None:
    got = dict(rrf([[1, 2, 1]], k=60))
    assert got == {1: pytest.approx(1 / 61), 2: pytest.approx(1 / 62)}


def test_rrf_is_deterministic_whatever_the_input_construction_order() -> None:
    rng = random.Random(7)
    ids = list(range(200))
    a = rng.sample(ids, 120)
    b = rng.sample(ids, 120)
    first = rrf([a, b])
    for _ in range(5):
        # Same rankings rebuilt from scratch (new list objects, shuffled set insertion order).
        assert rrf([list(a), list(b)]) == first
    # Swapping the lists changes nothing about the scores or the order.
    assert rrf([b, a]) == first


def test_rrf_rejects_a_k_below_one() -> None:
    with pytest.raises(ValueError):
        rrf([[1]], k=0)


def test_fuse_builds_candidates_with_bm25_and_vector_ranks() -> None:
    cands = fuse([1, 2], [2, 3], k=60, cosines={2: 0.9, 3: 0.5}, texts={1: "one", 2: "two"}, limit=2)
    assert [c.frag_id for c in cands] == [2, 1]
    top = cands[0]
    assert (top.bm25_rank, top.vector_rank, top.cosine, top.text) == (2, 1, 0.9, "two")
    assert top.score == pytest.approx(1 / 62 + 1 / 61)
    assert (cands[1].bm25_rank, cands[1].vector_rank, cands[1].cosine) == (1, None, None)


def test_term_coverage_counts_terms_and_adjacent_phrases() -> None:
    cov, phrase = term_coverage(["local", "first", "vault"], "A local-first design for a vault.")
    assert cov == pytest.approx(1.0)
    assert phrase == pytest.approx(0.5)  # "local first" adjacent, "first vault" not
    cov, phrase = term_coverage(["local", "first", "vault"], "The first vault is local.")
    assert cov == pytest.approx(1.0)
    assert phrase == pytest.approx(0.5)  # "first vault" adjacent this time


def test_term_coverage_respects_word_boundaries_but_credits_suffixes() -> None:
    cov, _ = term_coverage(["cat"], "a category of things")
    assert cov == 0.0
    cov, _ = term_coverage(["run"], "she was running home")
    assert cov == 1.0


def test_term_coverage_matches_cjk_terms_as_substrings() -> None:
    cov, phrase = term_coverage(["加密", "笔记"], "这是一个加密笔记应用")
    assert (cov, phrase) == (1.0, 1.0)
    cov, phrase = term_coverage(["加密", "笔记"], "笔记可以加密")
    assert (cov, phrase) == (1.0, 0.0)


def _cands(scores: list[float], texts: list[str]) -> list[Candidate]:
    return [Candidate(frag_id=i, score=s, text=t) for i, (s, t) in enumerate(zip(scores, texts, strict=True))]


def test_light_rerank_lifts_a_close_candidate_that_covers_the_query() -> None:
    # Fused scores of ranks (1,2) vs (2,1) neighbours: nearly equal.
    scores = [1 / 61 + 1 / 63, 1 / 62 + 1 / 62]
    texts = ["something about encryption only", "encrypted vault backup keys explained"]
    out = light_rerank(["encrypted", "vault", "backup"], _cands(scores, texts))
    assert [c.frag_id for c in out] == [1, 0]
    assert all(c.rerank_score is not None for c in out)
    assert out[0].rerank_score > out[1].rerank_score  # type: ignore[operator]


def test_light_rerank_prefers_the_matched_phrase_when_coverage_ties() -> None:
    scores = [0.030, 0.030]
    texts = ["first, the vault is local", "the vault is local-first"]
    out = light_rerank(["local", "first"], _cands(scores, texts))
    assert [c.frag_id for c in out] == [1, 0]


def test_light_rerank_cannot_wreck_a_clearly_better_fused_ranking() -> None:
    k = 60
    top = 2 / (k + 1)  # first in both lists
    far = 2 / (k + 11)  # eleventh in both lists
    single = 1 / (k + 1)  # first in one list only
    texts = ["nothing relevant here", "encrypted vault backup", "encrypted vault backup"]
    out = light_rerank(["encrypted", "vault", "backup"], _cands([top, far, single], texts))
    assert out[0].frag_id == 0


def test_light_rerank_only_reorders_and_keeps_fused_order_on_ties() -> None:
    cands = _cands([0.03, 0.02, 0.02, 0.01], ["x", "y", "y", "z"])
    out = light_rerank(["nomatch"], cands)
    assert [c.frag_id for c in out] == [0, 1, 2, 3]
    assert sorted(c.frag_id for c in out) == [c.frag_id for c in cands]
    assert light_rerank(["a"], []) == []


def test_light_rerank_is_deterministic() -> None:
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "vault", "key"]
    cands = [
        Candidate(frag_id=i, score=rng.choice([0.02, 0.025, 0.03]), text=" ".join(rng.choices(words, k=6)))
        for i in range(50)
    ]
    first = light_rerank(["vault", "key"], cands)
    for _ in range(3):
        assert light_rerank(["vault", "key"], list(cands)) == first


def test_order_by_scores_follows_remote_scores() -> None:
    cands = _cands([0.03, 0.02, 0.01], ["a", "b", "c"])
    out = order_by_scores(cands, [0.1, 0.9, 0.5])
    assert [c.frag_id for c in out] == [1, 2, 0]
    assert [c.rerank_score for c in out] == [0.9, 0.5, 0.1]
    assert all(math.isfinite(c.score) for c in out)
    with pytest.raises(ValueError):
        order_by_scores(cands, [0.1])


def test_weighted_rrf_lets_the_stronger_ranking_lead_and_defaults_to_plain_rrf() -> None:
    from memoriesd.rag.fusion import rrf, rrf_ranks

    bm25, vector = [1, 2, 3], [3, 2, 1]
    assert rrf([bm25, vector], 60) == [(f.frag_id, f.score) for f in rrf_ranks([bm25, vector], 60, weights=(1.0, 1.0))]
    assert rrf_ranks([bm25, vector], 60, weights=(1.0, 2.0))[0].frag_id == 3  # the vector side's first
    assert rrf_ranks([bm25, vector], 60, weights=(2.0, 1.0))[0].frag_id == 1
    import pytest

    for bad in ((1.0,), (1.0, -1.0), (1.0, float("nan"))):
        with pytest.raises(ValueError):
            rrf_ranks([bm25, vector], 60, weights=bad)


def test_rag_search_takes_a_vector_weight_and_refuses_one_out_of_range(tmp_path: object) -> None:
    from pathlib import Path

    from .conftest import cli_json, create_vault, run_cli, running_daemon
    from .tinymodel import make_tiny_model

    model = Path(str(tmp_path)) / "m"
    make_tiny_model(model, seed=1)
    with running_daemon(f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n') as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "title": "a", "body": "coffee tea"})
        out = cli_json(d.home, "rag", "search", vid, "coffee", "--mode", "hybrid", "--vector-weight", "2")
        assert out["mode"] == "hybrid" and out["results"]
        bad = run_cli(d.home, "rag", "search", vid, "coffee", "--mode", "hybrid", "--vector-weight", "0")
        assert bad.returncode == 2 and "--vector-weight" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------------------
# Convex fusion (the default)
# ---------------------------------------------------------------------------


def test_convex_normalises_each_list_and_weights_the_vector_side() -> None:
    bm25 = [(1, 12.0), (2, 6.0), (3, 2.0)]
    vector = [(2, 0.9), (4, 0.7), (1, 0.5)]
    got = {f.frag_id: f for f in convex_ranks(bm25, vector, weight=3.0)}
    # bm25_n: 1 -> 1, 2 -> 0.4, 3 -> 0; cos_n: 2 -> 1, 4 -> 0.5, 1 -> 0; absent counts 0.
    assert got[1].score == pytest.approx((1.0 + 3 * 0.0) / 4)
    assert got[2].score == pytest.approx((0.4 + 3 * 1.0) / 4)
    assert got[3].score == pytest.approx(0.0)
    assert got[4].score == pytest.approx(3 * 0.5 / 4)
    assert got[2].ranks == (2, 1) and got[4].ranks == (None, 2)
    assert [f.frag_id for f in convex_ranks(bm25, vector, weight=3.0)][0] == 2
    assert all(0.0 <= f.score <= 1.0 for f in got.values())


def test_convex_with_weight_zero_keeps_the_bm25_order_and_one_list_alone_is_its_own_order() -> None:
    bm25 = [(5, 3.0), (6, 2.0), (7, 1.0)]
    assert [f.frag_id for f in convex_ranks(bm25, [(7, 0.99)], weight=0.0)][:3] == [5, 6, 7]
    assert [f.frag_id for f in convex_ranks([], [(1, 0.8), (2, 0.3)], weight=1.0)] == [1, 2]
    single = convex_ranks([(9, 4.2)], [], weight=1.0)
    assert single[0].score == pytest.approx(0.5)  # a one-item list normalises to 1, weighted by 1 / (1 + w)


def test_convex_order_does_not_depend_on_input_order_and_ties_break_by_best_rank() -> None:
    bm25 = [(1, 2.0), (2, 1.0)]
    vector = [(2, 0.8), (1, 0.2)]
    a = convex_ranks(bm25, vector, weight=1.0)
    assert a[0].score == pytest.approx(a[1].score)
    assert [f.frag_id for f in a] == [1, 2]  # equal scores: best single rank, then id
    assert a == convex_ranks(list(bm25), list(vector), weight=1.0)


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
def test_convex_refuses_a_bad_weight(weight: float) -> None:
    with pytest.raises(ValueError):
        convex_ranks([(1, 1.0)], [(1, 0.5)], weight=weight)


def test_fuse_refuses_an_unknown_fusion_and_convex_uses_the_scores_it_is_given() -> None:
    with pytest.raises(ValueError, match="unknown fusion"):
        fuse([1], [2], method="borda")
    out = fuse([1, 2], [2, 1], method="convex", bm25_scores={1: 10.0, 2: 9.0}, cosines={2: 0.9, 1: 0.1}, vector_weight=2.0)
    assert [c.frag_id for c in out] == [2, 1] and out[0].bm25_rank == 2 and out[0].cosine == 0.9
