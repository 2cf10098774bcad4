"""The in-memory FTS5 BM25 index: match modes, hostile queries, limits, caps, quality and speed."""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from pathlib import Path

import pytest

from memoriesd.config import CacheConfig
from memoriesd.errors import CapExceeded, QueryInvalid
from memoriesd.index.bm25 import BM25Index
from memoriesd.index.docs import IndexedDoc, check_caps, doc_source_bytes, index_stats
from memoriesd.index.query import MAX_TERMS, parse_query
from memoriesd.text import segment as seg
from memoriesd.text.fragments import split_fragments
from tests.conftest import needs_shared

SHARED = Path(__file__).resolve().parents[2] / "shared"
KEY = b"test-key"


@pytest.fixture(scope="module", autouse=True)
def _jieba(tmp_path_factory: pytest.TempPathFactory) -> None:
    seg.configure(tmp_path_factory.mktemp("jieba"))


def doc(rid: str, body: str, *, title: str = "", meta: str = "", max_chars: int = 768) -> IndexedDoc:
    frags = tuple(split_fragments(rid, 1, body, KEY, max_chars=max_chars, overlap=max_chars // 6))
    return IndexedDoc(rid, 1, "note", title, meta, None, frags)


CORPUS = [
    doc(
        "en-vault", "The vault keeps notes encrypted and decrypts them only in memory.", title="Vault design"
    ),
    doc("en-local", "Local-first software keeps your data on your own device.", title="Local first"),
    doc("en-run", "She runs every morning; running clears the mind.", meta="tags: sport health"),
    doc("en-syntax", "Operators AND OR NOT, the NEAR function, title: foo and stars * with carets ^ too."),
    doc("en-quote", 'He said "hello world" and left.'),
    doc("zh-prc", "中华人民共和国成立于1949年。北京是首都。", title="历史笔记"),
    doc("zh-crypto", "加密的笔记只在内存中解密，本地优先。", meta="标签: 安全"),
    doc("mixed", "用Python写代码 😀 emoji notes and 中文 together."),
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index(CORPUS)


def rids(index: BM25Index, query: str, mode: str = "any", limit: int = 100) -> list[str]:
    return [
        index.fragments[h.frag_id][0].record_id
        for h in index.search(query, match_mode=mode, limit=limit).hits
    ]


def test_the_index_lives_in_memory_only(index: BM25Index) -> None:
    files = [row[2] for row in index._db.execute("PRAGMA database_list")]
    assert files == [""]


def test_any_ranks_fragments_with_any_term_and_scores_are_higher_is_better(index: BM25Index) -> None:
    res = index.search("vault device")
    found = [index.fragments[h.frag_id][0].record_id for h in res.hits]
    assert set(found) == {"en-vault", "en-local"}
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    assert res.ignored_terms == 0


def test_title_weighs_more_than_body(index: BM25Index) -> None:
    extra = BM25Index([doc("t", "unrelated words here", title="zebra"), doc("b", "a zebra in the body text")])
    assert rids(extra, "zebra") == ["t", "b"]
    extra.close()


def test_metadata_is_searchable(index: BM25Index) -> None:
    assert rids(index, "sport") == ["en-run"]
    assert rids(index, "安全") == ["zh-crypto"]


def test_english_words_are_stemmed(index: BM25Index) -> None:
    assert rids(index, "run") == ["en-run"]
    assert rids(index, "encrypt") == ["en-vault"]


def test_all_requires_every_term(index: BM25Index) -> None:
    assert set(rids(index, "keeps notes", "any")) == {"en-vault", "en-local", "mixed"}
    assert rids(index, "keeps notes", "all") == ["en-vault"]
    assert rids(index, "keeps zebra", "all") == []


def test_phrase_requires_the_words_in_order(index: BM25Index) -> None:
    assert rids(index, "only in memory", "phrase") == ["en-vault"]
    assert rids(index, "memory in only", "phrase") == []
    assert rids(index, "local first", "phrase") == ["en-local"]  # the hyphen is punctuation
    assert rids(index, '"hello world"', "phrase") == ["en-quote"]


def test_chinese_words_match_in_every_mode(index: BM25Index) -> None:
    assert rids(index, "中华人民共和国") == ["zh-prc"]
    assert rids(index, "首都是北京")[0] == "zh-prc"
    assert rids(index, "北京 首都", "all") == ["zh-prc"]
    assert rids(index, "北京 加密", "all") == []


def test_chinese_phrase_matches_inside_a_differently_segmented_word(index: BM25Index) -> None:
    # jieba cuts 人民共和国 differently on its own than inside 中华人民共和国.
    assert rids(index, "人民共和国", "phrase") == ["zh-prc"]
    assert rids(index, "人民共和国", "all") == ["zh-prc"]
    assert rids(index, "共和国人民", "phrase") == []
    assert rids(index, "只在内存", "phrase") == ["zh-crypto"]
    assert rids(index, "历史", "phrase") == ["zh-prc"]  # the title counts


def test_chinese_word_inside_a_longer_word_is_found_in_any_mode(index: BM25Index) -> None:
    assert "zh-prc" in rids(index, "人民共和")


def test_mixed_script_text(index: BM25Index) -> None:
    assert rids(index, "python") == ["mixed"]
    assert rids(index, "写代码", "phrase") == ["mixed"]
    assert rids(index, "emoji 中文", "all") == ["mixed"]


# (query, mode, expected record ids): FTS5 syntax in user text is searched as words.
HOSTILE = [
    ('"', "any", None),
    ('"""', "phrase", None),
    ('hello "world', "all", ["en-quote"]),
    ('hello" OR "vault', "all", []),
    ("title:foo", "any", ["en-syntax"]),
    ("title:vault", "all", []),  # not a column filter: "title" is not in en-vault's text
    ("{title body}: vault", "any", ["en-vault", "en-syntax"]),
    ("NEAR(vault memory)", "all", []),  # NEAR is a word here
    ("NEAR(function)", "all", ["en-syntax"]),
    ("vault*", "any", ["en-vault"]),
    ("vaul*", "any", []),  # no prefix queries
    ("^vault", "any", ["en-vault"]),
    ("vault AND device", "all", []),
    ("NOT vault", "any", ["en-vault", "en-syntax"]),
    ("OR", "any", ["en-syntax"]),
    ("vault NOT", "phrase", []),
    ("- + ( ) : , ; . ' \\", "any", None),
    ("😀", "any", None),
    ("😀 emoji", "any", ["mixed"]),
    ("vault\x00memory", "all", ["en-vault"]),
    ("\x00", "any", None),
    ("col:*^\"'", "any", []),
    ("*^\"'", "any", None),
]


@pytest.mark.parametrize(("query", "mode", "expected"), HOSTILE)
def test_hostile_queries_are_text_never_syntax(
    index: BM25Index, query: str, mode: str, expected: list[str] | None
) -> None:
    if expected is None:
        with pytest.raises(QueryInvalid) as exc:
            index.search(query, match_mode=mode)
        assert exc.value.message.startswith("the query has no searchable words")
        return
    assert sorted(set(rids(index, query, mode))) == sorted(expected)
    frag_ids = range(len(index.fragments))
    assert {index.fragments[i][0].record_id for i in index.filter(query, mode, frag_ids)} == set(expected)


def test_long_queries_are_refused_cleanly(index: BM25Index) -> None:
    with pytest.raises(QueryInvalid) as exc:
        index.search("a" * 2048)
    assert exc.value.message == "the query is 2,048 bytes, over the limit of 1,024 bytes: shorten it"
    with pytest.raises(QueryInvalid):
        index.search("中" * 342)  # 1,026 bytes
    index.search("中" * 341)  # 1,023 bytes: accepted


def test_terms_past_64_are_ignored_and_reported(index: BM25Index) -> None:
    words = [f"w{i}" for i in range(199)] + ["vault"]
    res = index.search(" ".join(words))
    assert res.ignored_terms == 200 - MAX_TERMS
    assert res.hits == []  # "vault" was term 200: ignored
    res = index.search(" ".join(["vault"] + words[:199]))
    assert res.ignored_terms == 200 - MAX_TERMS and rids(index, "vault") == ["en-vault"]
    assert parse_query("a a a A b").terms == ("a", "b")  # repeats count once


def test_limits_and_modes_are_validated(index: BM25Index) -> None:
    for bad in (0, 101, -1, True, 2.5):
        with pytest.raises(QueryInvalid):
            index.search("vault", limit=bad)  # type: ignore[arg-type]
    with pytest.raises(QueryInvalid) as exc:
        index.search("vault", match_mode="fuzzy")
    assert "any, all or phrase" in exc.value.message
    assert len(index.search("the", limit=1).hits) == 1
    assert len(index.candidates("the", limit=1000).hits) >= 2


def test_filter_applies_a_mode_to_given_candidates(index: BM25Index) -> None:
    ids = {rid: index.frag_ids(rid)[0] for rid in ("en-vault", "en-local", "zh-prc")}
    cands = list(ids.values())
    assert index.filter("keeps notes", "all", cands) == {ids["en-vault"]}
    assert index.filter("keeps", "any", cands) == {ids["en-vault"], ids["en-local"]}
    assert index.filter("人民共和国", "phrase", cands) == {ids["zh-prc"]}
    assert index.filter("vault", "any", []) == set()
    assert index.filter("vault", "any", range(10_000, 12_000)) == set()


def test_common_terms_do_not_hide_fragments_that_have_only_them() -> None:
    docs = [doc(f"d{i}", "the common word" + (" rare" if i == 0 else "")) for i in range(10)]
    ix = BM25Index(docs)
    res = ix.search("common rare", limit=20)
    assert len(res.hits) == 10
    assert ix.fragments[res.hits[0].frag_id][0].record_id == "d0"
    ix.close()


def test_records_can_be_replaced_and_removed() -> None:
    ix = BM25Index([doc("a", "apple pie"), doc("b", "banana bread"), doc("c", "中华人民共和国")])
    ix.add([doc("a", "cherry tart")])
    assert rids(ix, "apple") == [] and rids(ix, "cherry") == ["a"]
    ix.remove(["b", "c", "missing"])
    assert rids(ix, "banana") == [] and rids(ix, "人民共和国", "phrase") == []
    assert ix.stats.fragments == 1
    assert ix.stats.source_bytes == len("cherry tart")
    ix.close()


def test_changes_before_and_after_the_first_query_leave_no_stale_rows() -> None:
    # Rows are written on the first query: replace and remove records on both sides of it.
    ix = BM25Index([doc("a", "apple pie"), doc("b", "banana bread"), doc("c", "中华人民共和国")])
    ix.add([doc("a", "apple crumble")])  # replaced before any row was written
    ix.remove(["c"])
    assert rids(ix, "apple") == ["a"] and rids(ix, "pie") == [] and rids(ix, "共和国", "phrase") == []
    ix.add([doc("a", "cherry tart"), doc("d", "apple strudel 共和国")])  # after rows exist
    ix.remove(["b"])
    assert rids(ix, "apple") == ["d"] and rids(ix, "banana") == [] and rids(ix, "共和国", "phrase") == ["d"]
    assert rids(ix, "cherry", "all") == ["a"]
    live = {fid for rid in ("a", "d") for fid in ix.frag_ids(rid)}
    assert ix.filter("apple cherry", "any", range(ix._next_id)) == live  # every id ever given out
    assert ix.stats == index_stats([doc("a", "cherry tart"), doc("d", "apple strudel 共和国")])
    ix.close()


def test_stats_count_body_bytes_once_despite_overlap() -> None:
    body = "word " * 400
    d = doc("r", body, title="标题", meta="tags: x", max_chars=100)
    assert len(d.fragments) > 5
    assert doc_source_bytes(d) == len(body.strip()) + len("标题".encode()) + len("tags: x")
    ix = BM25Index([d])
    assert ix.stats == index_stats([d])
    ix.close()


def test_cap_messages_name_the_cap_the_size_and_the_key() -> None:
    with pytest.raises(CapExceeded) as exc:
        check_caps(12_345, 10, CacheConfig(max_fragments=10_000))
    assert exc.value.message == (
        "this vault has 12,345 fragments, over the cache cap of 10,000: "
        "raise [index] max_fragments in config.toml"
    )
    with pytest.raises(CapExceeded) as exc:
        check_caps(5, 17 * 1024 * 1024, CacheConfig(max_source_mib=16))
    assert "17.0 MiB of text, over the cache cap of 16 MiB" in exc.value.message
    assert "[index] max_source_mib" in exc.value.message
    check_caps(10_000, 16 * 1024 * 1024, CacheConfig())


# -- quality and speed on the shared evaluation sets ----------------------------------


def _load(name: str) -> tuple[BM25Index, dict[str, str], dict[str, set[str]], float]:
    d = SHARED / "eval" / name
    corpus = [json.loads(line) for line in (d / "corpus.jsonl").open(encoding="utf-8")]
    qrels: dict[str, set[str]] = {}
    with (d / "qrels" / "test.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels.setdefault(row["query-id"], set()).add(row["corpus-id"])
    queries = {q["_id"]: q["text"] for q in map(json.loads, (d / "queries.jsonl").open(encoding="utf-8"))}
    docs = [doc(c["_id"], c["text"], title=c.get("title", "")) for c in corpus]
    t0 = time.perf_counter()
    ix = BM25Index(docs)
    return ix, {k: v for k, v in queries.items() if k in qrels}, qrels, time.perf_counter() - t0


def _ndcg10(
    index: BM25Index, queries: dict[str, str], qrels: dict[str, set[str]]
) -> tuple[float, list[float]]:
    scores: list[float] = []
    latencies: list[float] = []
    for qid, text in queries.items():
        t0 = time.perf_counter()
        hits = index.candidates(text, limit=100).hits
        latencies.append(time.perf_counter() - t0)
        ranked: list[str] = []
        for h in hits:
            rid = index.fragments[h.frag_id][0].record_id
            if rid not in ranked:
                ranked.append(rid)
        rel = qrels[qid]
        dcg = sum(1 / math.log2(i + 2) for i, r in enumerate(ranked[:10]) if r in rel)
        idcg = sum(1 / math.log2(i + 2) for i in range(min(10, len(rel))))
        scores.append(dcg / idcg)
    return statistics.fmean(scores), sorted(latencies)


@pytest.mark.skipif(not (SHARED / "eval" / "scifact").is_dir(), reason=needs_shared("eval/scifact"))
def test_scifact_quality_meets_the_fragment_level_baseline() -> None:
    """Quality only: speed targets live in bench/bench_bm25.py, never in timed assertions."""
    ix, queries, qrels, _ = _load("scifact")
    assert ix.stats.fragments > 13_000
    ndcg, _ = _ndcg10(ix, queries, qrels)
    assert ndcg >= 0.68
    ix.close()


@pytest.mark.skipif(not (SHARED / "eval" / "xquad-zh").is_dir(), reason=needs_shared("eval/xquad-zh"))
def test_xquad_zh_quality() -> None:
    ix, queries, qrels, _ = _load("xquad-zh")
    ndcg, _ = _ndcg10(ix, queries, qrels)
    assert ndcg >= 0.95
    ix.close()


def test_concurrent_searches_and_updates_do_not_interfere() -> None:
    import threading

    ix = BM25Index([doc(f"d{i}", f"shared words number{i} 共享文本") for i in range(50)])
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(50):
                assert ix.search("shared 共享", limit=10).hits
                assert ix.filter("共享文本", "phrase", range(60))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(20):
        ix.add([doc(f"d{i}", f"shared words replaced{i} 共享文本")])
    for t in threads:
        t.join()
    assert errors == []
    assert ix.stats.fragments == 50
    assert rids(ix, "replaced7") == ["d7"]
    ix.close()
