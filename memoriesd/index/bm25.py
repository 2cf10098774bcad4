"""The in-memory BM25 index of one unlocked vault (SQLite FTS5, never on disk).

One FTS5 row per fragment, ``rowid`` = ``frag_id`` = the fragment's position in
:attr:`BM25Index.fragments`. Columns: the record's title, the fragment text and
the record's metadata text, each segmented (:func:`~memoriesd.text.segment.segment`),
ranked with ``bm25(t, 5, 1, 2)`` (title 5, body 1, metadata 2). FTS5's bm25 is
lower-is-better; scores here are negated so that higher is better.

Rows whose title, body or metadata contain Han characters are also held in a
second, "exact" table with one token per Han character. ``all`` and ``phrase``
queries that contain Han text are checked there, so 人民共和国 matches inside
中华人民共和国 even though jieba cut the two differently. Both tables are
contentless (``content=''``): the text lives once, in :attr:`fragments`. Rows are written on
the first lexical query after documents were added, not when they are added.

Thread-safe: one lock around the connection.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import CacheConfig
from ..errors import CapExceeded, Internal, QueryInvalid
from ..text.fragments import Fragment
from ..text.segment import DEFAULT, Segmentation, has_han, segment, segment_chars
from .query import ParsedQuery, or_expression, parse_query, quote

#: Column weights of bm25(): title, body, metadata.
WEIGHTS = (5.0, 1.0, 2.0)
#: Largest ``limit`` of :meth:`BM25Index.search` (user-facing).
MAX_LIMIT = 100
#: Largest ``limit`` of :meth:`BM25Index.candidates` (hybrid candidates, evaluation).
MAX_CANDIDATES = 10_000
_MIB = 1024 * 1024
_FILTER_CHUNK = 500
#: Terms in more than this share of fragments are left out of ranking expressions.
PRUNE_DF_SHARE = 0.3


@dataclass(frozen=True)
class IndexedDoc:
    """A record revision as the index sees it."""

    record_id: str
    revision: int
    kind: str
    title: str
    meta_text: str
    source: str | None
    fragments: tuple[Fragment, ...]


@dataclass(frozen=True)
class Hit:
    frag_id: int
    score: float  # higher is better


@dataclass
class SearchResult:
    hits: list[Hit]
    ignored_terms: int  # query terms past the term limit


@dataclass(frozen=True)
class IndexStats:
    """Sizes that the cache caps apply to."""

    fragments: int
    source_bytes: int  # UTF-8 bytes of titles, bodies (once, not per overlap) and metadata text


def doc_source_bytes(doc: IndexedDoc) -> int:
    """UTF-8 bytes of a document's title, body and metadata text.

    The body counts once: the union of its fragments' byte ranges.
    """
    body = 0
    covered = 0
    for f in sorted(doc.fragments, key=lambda f: f.start):
        lo = max(f.start, covered)
        if f.end > lo:
            body += f.end - lo
            covered = f.end
    return len(doc.title.encode("utf-8")) + len(doc.meta_text.encode("utf-8")) + body


def index_stats(docs: Iterable[IndexedDoc]) -> IndexStats:
    """Stats of the index ``docs`` would make, without building it (to check caps first)."""
    n = 0
    size = 0
    for d in docs:
        n += len(d.fragments)
        size += doc_source_bytes(d)
    return IndexStats(fragments=n, source_bytes=size)


def check_caps(n_fragments: int, source_bytes: int, cache: CacheConfig) -> None:
    """Raise :class:`CapExceeded` when a vault is over the cache caps of ``[rag.cache]``."""
    if n_fragments > cache.max_fragments:
        raise CapExceeded(
            f"this vault has {n_fragments:,} fragments, over the cache cap of {cache.max_fragments:,}: "
            "raise [rag.cache] max_fragments in config.toml"
        )
    limit = cache.max_source_mib * _MIB
    if source_bytes > limit:
        raise CapExceeded(
            f"this vault has {source_bytes / _MIB:,.1f} MiB of text, over the cache cap of "
            f"{cache.max_source_mib:g} MiB: raise [rag.cache] max_source_mib in config.toml"
        )


class BM25Index:
    """BM25 over the fragments of one vault. See the module docstring."""

    def __init__(self, docs: Sequence[IndexedDoc], *, segmentation: Segmentation = DEFAULT) -> None:
        self.segmentation = segmentation
        # frag_id -> (doc, fragment) of live records only: a removed record's fragments are released
        # (frag_ids are never reused, so a stale id held elsewhere can only miss, never mislead).
        self.fragments: dict[int, tuple[IndexedDoc, Fragment]] = {}
        self._next_id = 0
        self._live: dict[str, list[int]] = {}  # record_id -> its frag_ids
        self._exact_rows: set[int] = set()
        self._n_fragments = 0
        self._source_bytes = 0
        self.prune_df_share = PRUNE_DF_SHARE
        self._df: dict[str, int] = {}  # term (casefolded) -> fragments containing it
        self._pending: dict[str, tuple[IndexedDoc, list[int]]] = {}  # added, FTS5 rows not written yet
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        tok = segmentation.fts5_tokenizer
        for table in ("t", "x"):
            self._db.execute(
                f"CREATE VIRTUAL TABLE {table} USING fts5(title, body, meta, content='', tokenize='{tok}')"
            )
        self.add(docs)

    # -- building ---------------------------------------------------------------

    def add(self, docs: Sequence[IndexedDoc]) -> None:
        """Index more documents (new frag_ids are appended). A record already present is replaced.

        Fragments get their frag_ids at once; segmenting them and writing their FTS5 rows waits for
        the first lexical query (:meth:`_flush_locked`), so a vault used only for vector search or
        ``rag index`` never pays for jieba and FTS5.
        """
        with self._lock:
            self._df.clear()
            for doc in docs:
                if doc.record_id in self._live:
                    self._remove_locked(doc.record_id)
                ids: list[int] = []
                for frag in doc.fragments:
                    ids.append(self._next_id)
                    self.fragments[self._next_id] = (doc, frag)
                    self._next_id += 1
                self._live[doc.record_id] = ids
                self._pending[doc.record_id] = (doc, ids)
                self._n_fragments += len(ids)
                self._source_bytes += doc_source_bytes(doc)

    def _flush_locked(self) -> None:
        """Write the FTS5 rows of documents added since the last query. Caller holds the lock."""
        if not self._pending:
            return
        han_only = self.segmentation.han_only
        self._df.clear()
        exact_ids: list[int] = []
        self._db.execute("BEGIN")
        try:
            for doc, ids in self._pending.values():
                title_seg = segment(doc.title, han_only=han_only)
                meta_seg = segment(doc.meta_text, han_only=han_only)
                doc_han = has_han(doc.title) or has_han(doc.meta_text)
                rows: list[tuple[int, str, str, str]] = []
                exact: list[tuple[int, str, str, str]] = []
                for fid, frag in zip(ids, doc.fragments, strict=True):
                    rows.append((fid, title_seg, segment(frag.text, han_only=han_only), meta_seg))
                    if doc_han or has_han(frag.text):
                        exact.append(self._exact_row(fid, doc, frag))
                self._db.executemany("INSERT INTO t(rowid, title, body, meta) VALUES (?, ?, ?, ?)", rows)
                if exact:
                    self._db.executemany("INSERT INTO x(rowid, title, body, meta) VALUES (?, ?, ?, ?)", exact)
                    exact_ids.extend(r[0] for r in exact)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._exact_rows.update(exact_ids)
        self._pending.clear()

    @staticmethod
    def _exact_row(fid: int, doc: IndexedDoc, frag: Fragment) -> tuple[int, str, str, str]:
        return fid, segment_chars(doc.title), segment_chars(frag.text), segment_chars(doc.meta_text)

    def remove(self, record_ids: Iterable[str]) -> None:
        """Drop records from the index (their frag_ids are never reused or returned again)."""
        with self._lock:
            self._df.clear()
            self._db.execute("BEGIN")
            try:
                for rid in record_ids:
                    self._remove_locked(rid)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _remove_locked(self, record_id: str) -> None:
        ids = self._live.pop(record_id, None)
        if not ids:
            return
        pending = self._pending.pop(record_id, None)
        if pending is not None:  # its rows were never written
            self._n_fragments -= len(ids)
            self._source_bytes -= doc_source_bytes(pending[0])
            for fid in ids:
                self.fragments.pop(fid, None)
            return
        han_only = self.segmentation.han_only
        doc = self.fragments[ids[0]][0]
        title_seg = segment(doc.title, han_only=han_only)
        meta_seg = segment(doc.meta_text, han_only=han_only)
        for fid in ids:
            _, frag = self.fragments[fid]
            # Contentless tables are deleted by repeating the indexed values.
            self._db.execute(
                "INSERT INTO t(t, rowid, title, body, meta) VALUES ('delete', ?, ?, ?, ?)",
                (fid, title_seg, segment(frag.text, han_only=han_only), meta_seg),
            )
            if fid in self._exact_rows:
                self._db.execute(
                    "INSERT INTO x(x, rowid, title, body, meta) VALUES ('delete', ?, ?, ?, ?)",
                    self._exact_row(fid, doc, frag),
                )
                self._exact_rows.discard(fid)
        for fid in ids:
            del self.fragments[fid]
        self._n_fragments -= len(ids)
        self._source_bytes -= doc_source_bytes(doc)

    # -- reading ----------------------------------------------------------------

    def held_fragments(self) -> int:
        """Fragments held in memory (those of live records only)."""
        return len(self.fragments)

    @property
    def stats(self) -> IndexStats:
        return IndexStats(fragments=self._n_fragments, source_bytes=self._source_bytes)

    def frag_ids(self, record_id: str) -> list[int]:
        """The live frag_ids of a record, in fragment order ([] when absent)."""
        return list(self._live.get(record_id, ()))

    def parse(self, query: str, match_mode: str = "any") -> ParsedQuery:
        """Validate a query as :meth:`search` would (raises :class:`QueryInvalid`)."""
        return parse_query(query, match_mode, han_only=self.segmentation.han_only)

    def _ranking_expression(self, terms: Sequence[str]) -> tuple[str, bool]:
        """The OR of the terms without those in more than PRUNE_DF_SHARE of the fragments, and whether any were left out.

        Scoring every row a common term occurs in dominates query time (a query
        with "the" or "of" touches nearly every row), while such a term adds
        little to any score: FTS5 clamps the IDF of a term in more than half of
        the rows to 1e-6, and one in 30 % of them has an IDF of about 0.85
        against 5-9 for the terms that decide a ranking. Measured on SciFact
        (``scripts/bench_bm25.py``, README): leaving out terms above 30 % cuts
        the median query time by about a third for -0.002 nDCG@10 (0.6845 to
        0.6828); above 50 % it keeps the ranking exactly. The caller re-runs
        the full OR when the pruned query returns fewer rows than asked for, so
        fragments that have only common terms are still found. When every term
        is that common, all are kept. Caller holds the lock.
        """
        common = self._n_fragments * self.prune_df_share
        keep: list[str] = []
        for t in terms:
            key = t.casefold()
            df = self._df.get(key)
            if df is None:
                df = self._db.execute("SELECT count(*) FROM t WHERE t MATCH ?", (quote(t),)).fetchone()[0]
                self._df[key] = df
            if 0 < df <= common:
                keep.append(t)
        if not keep or len(keep) == len(terms):
            return or_expression(terms), False
        return or_expression(keep), True

    def search(self, query: str, *, match_mode: str = "any", limit: int = 10) -> SearchResult:
        """The best ``limit`` (1..100) fragments for ``query``, best first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not (1 <= limit <= MAX_LIMIT):
            raise QueryInvalid(f"limit {limit!r} is out of range: use 1 to {MAX_LIMIT}")
        return self.candidates(query, match_mode=match_mode, limit=limit)

    def candidates(self, query: str, *, match_mode: str = "any", limit: int = 100) -> SearchResult:
        """Like :meth:`search` with a larger bound (1..10,000), for hybrid candidates and evaluation."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not (1 <= limit <= MAX_CANDIDATES):
            raise QueryInvalid(f"candidate limit {limit!r} is out of range: use 1 to {MAX_CANDIDATES:,}")
        pq = self.parse(query, match_mode)
        w_title, w_body, w_meta = WEIGHTS
        score = f"bm25(t, {w_title}, {w_body}, {w_meta})"
        with self._lock:
            try:
                self._flush_locked()
                if pq.constraint is None or (pq.match_mode == "all" and not pq.constraint_exact):
                    # bm25 of an AND of terms is the OR's score on the rows that have them all.
                    sql = f"SELECT rowid, {score} AS s FROM t WHERE t MATCH ? ORDER BY s, rowid LIMIT ?"
                    if pq.constraint is None:
                        expr, pruned = self._ranking_expression(pq.ranked_terms)
                    else:
                        expr, pruned = pq.constraint, False
                    rows = self._db.execute(sql, (expr, limit)).fetchall()
                    if pruned and len(rows) < limit:
                        rows = self._db.execute(sql, (pq.ranked, limit)).fetchall()
                    fallback = pq.exact_any
                else:
                    table = "x" if pq.constraint_exact else "t"
                    sql = (
                        f"SELECT rowid, {score} AS s FROM t WHERE t MATCH ? AND rowid IN "
                        f"(SELECT rowid FROM {table} WHERE {table} MATCH ?) ORDER BY s, rowid LIMIT ?"
                    )
                    expr, pruned = self._ranking_expression(pq.ranked_terms)
                    rows = self._db.execute(sql, (expr, pq.constraint, limit)).fetchall()
                    if pruned and len(rows) < limit:
                        rows = self._db.execute(sql, (pq.ranked, pq.constraint, limit)).fetchall()
                    fallback = pq.constraint if pq.constraint_exact else None
                hits = [Hit(r[0], -r[1]) for r in rows]
                if len(hits) < limit and fallback is not None:
                    self._append_exact(hits, fallback, limit)
                return SearchResult(hits, pq.ignored_terms)
            except sqlite3.Error as exc:  # pragma: no cover - parse_query only emits quoted strings
                raise Internal("the lexical index failed to run a query: report this as a bug") from exc

    def _append_exact(self, hits: list[Hit], expr: str, limit: int) -> None:
        """Add exact-index matches that ranking missed, score 0, in frag_id order.

        They contain the Han text but none of jieba's words for it (jieba cut
        their context differently). Caller holds the lock.
        """
        seen = {h.frag_id for h in hits}
        cur = self._db.execute("SELECT rowid FROM x WHERE x MATCH ? ORDER BY rowid", (expr,))
        for (fid,) in cur:
            if len(hits) >= limit:
                break
            if fid not in seen:
                hits.append(Hit(fid, 0.0))

    def filter(self, query: str, match_mode: str, frag_ids: Iterable[int]) -> set[int]:
        """Which of ``frag_ids`` satisfy ``query`` in ``match_mode`` (for vector and hybrid candidates)."""
        pq = self.parse(query, match_mode)
        ids = sorted({int(i) for i in frag_ids})
        checks: list[tuple[str, str]] = []
        if pq.constraint is None:
            checks.append(("t", pq.ranked))
            if pq.exact_any is not None:
                checks.append(("x", pq.exact_any))
        else:
            checks.append(("x" if pq.constraint_exact else "t", pq.constraint))
        out: set[int] = set()
        with self._lock:
            try:
                self._flush_locked()
                for table, expr in checks:
                    for i in range(0, len(ids), _FILTER_CHUNK):
                        chunk = ids[i : i + _FILTER_CHUNK]
                        marks = ",".join("?" * len(chunk))
                        rows = self._db.execute(
                            f"SELECT rowid FROM {table} WHERE {table} MATCH ? AND rowid IN ({marks})",
                            (expr, *chunk),
                        ).fetchall()
                        out.update(r[0] for r in rows)
            except sqlite3.Error as exc:  # pragma: no cover
                raise Internal("the lexical index failed to run a query: report this as a bug") from exc
        return out

    def close(self) -> None:
        """Free the in-memory database (e.g. when the vault locks)."""
        with self._lock:
            self._db.close()
