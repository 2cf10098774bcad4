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

The database lives in memory only (``temp_store = MEMORY``: sorts and VACUUM never spill to a
temp file). :meth:`BM25Index.export` and :meth:`BM25Index.restore` turn it into bytes and back
(``serialize``/``deserialize``) for the sealed snapshot (:mod:`memoriesd.index.snapshot`).

Thread-safe: one lock around the connection.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..errors import Internal, QueryInvalid
from ..text.fragments import Fragment
from ..text.segment import DEFAULT, Segmentation, has_han, segment, segment_chars
from .docs import IndexedDoc, IndexStats, doc_source_bytes
from .query import ParsedQuery, or_expression, parse_query, quote

__all__ = ["BM25Index", "Hit", "MAX_CANDIDATES", "MAX_LIMIT", "SearchResult"]

#: Column weights of bm25(): title, body, metadata.
WEIGHTS = (5.0, 1.0, 2.0)
#: Largest ``limit`` of :meth:`BM25Index.search` (user-facing).
MAX_LIMIT = 100
#: Largest ``limit`` of :meth:`BM25Index.candidates` (hybrid candidates, evaluation).
MAX_CANDIDATES = 10_000
_FILTER_CHUNK = 500
#: Documents per transaction of :meth:`BM25Index.flush` (a lock or a query waits for at most one).
FLUSH_CHUNK_DOCS = 2048
#: Terms in more than this share of fragments are left out of ranking expressions.
PRUNE_DF_SHARE = 0.3
#: Then the most common terms left are dropped until the rest occur in at most this many fragments.
PRUNE_ROW_BUDGET = 20_000


@dataclass(frozen=True)
class Hit:
    frag_id: int
    score: float  # higher is better


@dataclass
class SearchResult:
    hits: list[Hit]
    ignored_terms: int  # query terms past the term limit


def _connect() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    # Large sorts and VACUUM would otherwise use temp files: derived plaintext never goes to disk.
    db.execute("PRAGMA temp_store = MEMORY")
    return db


def _schema(segmentation: Segmentation) -> list[str]:
    tok = segmentation.fts5_tokenizer
    return [
        f"CREATE VIRTUAL TABLE {table} USING fts5(title, body, meta, content='', tokenize='{tok}')"
        for table in ("t", "x")
    ]


class BM25Index:
    """BM25 over the fragments of one vault. See the module docstring."""

    def __init__(self, docs: Sequence[IndexedDoc], *, segmentation: Segmentation = DEFAULT) -> None:
        self._init_state(segmentation, _connect())
        for sql in _schema(segmentation):
            self._db.execute(sql)
        self.add(docs)

    def _init_state(self, segmentation: Segmentation, db: sqlite3.Connection) -> None:
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
        self.prune_row_budget = PRUNE_ROW_BUDGET
        self._df: dict[str, int] = {}  # term (casefolded) -> fragments containing it
        self._pending: dict[str, tuple[IndexedDoc, list[int]]] = {}  # added, FTS5 rows not written yet
        self._has_rows = False  # rows were written (a lexical query ran) or restored
        self.rows_changed = 0  # rows written or deleted so far (to tell how stale a snapshot is)
        self._lock = threading.Lock()
        self._db = db

    @classmethod
    def restore(
        cls,
        image: bytes,
        docs: Sequence[tuple[IndexedDoc, int]],
        exact_rows: Iterable[int],
        next_id: int,
        source_bytes: int,
        *,
        segmentation: Segmentation = DEFAULT,
    ) -> BM25Index:
        """An index from :meth:`export`'s output: ``image`` is the serialized database, ``docs``
        each document with its first frag_id (its fragments have consecutive ids), ``source_bytes``
        their :attr:`IndexStats.source_bytes` (not recomputed: a restore touches each fragment once).

        Raises ``ValueError`` when the parts do not fit together (wrong tables, row counts or ids):
        the caller then rebuilds rather than trust them.
        """
        db = _connect()
        try:
            db.deserialize(image)
            db.execute("PRAGMA temp_store = MEMORY")
            idx = cls.__new__(cls)
            idx._init_state(segmentation, db)
            tables = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE name IN ('t', 'x')").fetchall())
            if [tables.get("t"), tables.get("x")] != _schema(segmentation):
                raise ValueError("the tables differ from this version's")
            seen = 0
            for doc, first in docs:
                n = len(doc.fragments)
                if n == 0 or first < seen or first + n > next_id or doc.record_id in idx._live:
                    raise ValueError("fragment ids overlap or are out of range")
                ids = list(range(first, first + n))
                for fid, frag in zip(ids, doc.fragments, strict=True):
                    idx.fragments[fid] = (doc, frag)
                idx._live[doc.record_id] = ids
                idx._n_fragments += n
                seen = first + n
            idx._next_id = next_id
            idx._source_bytes = source_bytes
            idx._exact_rows = set(exact_rows)
            if not idx._exact_rows <= idx.fragments.keys():
                raise ValueError("exact rows of unknown fragments")
            (n_rows, top) = db.execute("SELECT count(*), max(id) FROM t_docsize").fetchone()
            (n_exact,) = db.execute("SELECT count(*) FROM x_docsize").fetchone()
            if n_rows != idx._n_fragments or n_exact != len(idx._exact_rows) or (top is not None and top >= next_id):
                raise ValueError("the rows do not match the fragments")
            idx._has_rows = True
            return idx
        except BaseException:
            db.close()
            raise

    def export(self, *, flush: bool) -> tuple[bytes, list[tuple[IndexedDoc, int]], list[int], int, int]:
        """The serialized database, each document whose rows it holds with its first frag_id, the
        frag_ids of exact-table rows, the next frag_id (for :meth:`restore`) and :attr:`rows_changed`
        (the source bytes :meth:`restore` needs are the sum of the documents' ``source_bytes``).

        ``flush`` writes pending rows first; without it, documents still pending are left out (the
        snapshot then simply lacks them and they are indexed again after the next restore).
        """
        with self._lock:
            if flush:
                self._flush_locked()
            docs = [
                (self.fragments[ids[0]][0], ids[0])
                for rid, ids in self._live.items()
                if ids and rid not in self._pending
            ]
            return self._db.serialize(), docs, sorted(self._exact_rows), self._next_id, self.rows_changed

    @property
    def exports_every_document(self) -> bool:
        """Whether :meth:`export` without ``flush`` would hold every document: none pending, none
        without fragments (a restore of such an export needs no comparison with the vault)."""
        with self._lock:
            return not self._pending and all(self._live.values())

    @property
    def has_rows(self) -> bool:
        """Whether FTS5 rows exist (a lexical query ran, or the index was restored)."""
        return self._has_rows

    def purge(self) -> None:
        """Merge each table into one segment and rebuild the database without free pages, so that
        nothing of removed rows is left in its bytes (before a snapshot after ``vault compact``)."""
        with self._lock:
            self._flush_locked()
            for table in ("t", "x"):
                self._db.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
            self._db.execute("VACUUM")

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

    def flush(self, check: Callable[[], None] = lambda: None, *, chunk: int = FLUSH_CHUNK_DOCS) -> None:
        """Write every pending document's FTS5 rows now (in the background, so that the first query
        finds none pending), ``chunk`` documents per transaction; ``check`` runs before each (it
        raises to stop: what was written stays written, the rest stays pending)."""
        while True:
            check()
            with self._lock:
                if not self._pending:
                    return
                self._flush_locked(limit=chunk)

    def _flush_locked(self, limit: int | None = None) -> None:
        """Write the FTS5 rows of documents added since the last query (the first ``limit`` of them).
        Caller holds the lock."""
        if not self._pending:
            return
        han_only = self.segmentation.han_only
        self._df.clear()
        exact_ids: list[int] = []
        batch = list(self._pending.values()) if limit is None else list(itertools.islice(self._pending.values(), limit))
        self._db.execute("BEGIN")
        try:
            for doc, ids in batch:
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
        self.rows_changed += sum(len(ids) for _, ids in batch)
        if limit is None or len(batch) == len(self._pending):
            self._pending.clear()
        else:
            for doc, _ in batch:
                del self._pending[doc.record_id]
        self._has_rows = True

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
        self.rows_changed += len(ids)
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
        """The OR of the terms without the most common ones (see below), and whether any were left out.

        Scoring every row a common term occurs in dominates query time (a query
        with "the" or "of" touches nearly every row), while such a term adds
        little to any score: FTS5 clamps the IDF of a term in more than half of
        the rows to 1e-6, and one in 30 % of them has an IDF of about 0.85
        against 5-9 for the terms that decide a ranking. Measured on SciFact
        (``bench/bench_bm25.py``, docs/search.md "BM25"): leaving out terms above 30 % cuts
        the median query time by about a third for -0.002 nDCG@10 (0.6845 to
        0.6828); above 50 % it keeps the ranking exactly. The caller re-runs
        the full OR when the pruned query returns fewer rows than asked for, so
        fragments that have only common terms are still found. When every term
        is that common, all are kept.

        In a large vault a long query still scores tens of thousands of rows
        (about 1 µs each): then the most common of the remaining terms are left
        out too, until the terms kept occur in at most PRUNE_ROW_BUDGET
        fragments together (the rarest term is always kept). Measured on
        SciFact repeated to 100,000 fragments (docs/search.md): the BM25 ``any`` median
        falls from 40 to 14 ms for -0.003 nDCG@10 (0.6732 to 0.6701); a vault
        of 10,000 fragments rarely reaches the budget. Caller holds the lock.
        """
        common = self._n_fragments * self.prune_df_share
        keep: list[str] = []
        dfs: dict[str, int] = {}
        for t in terms:
            key = t.casefold()
            df = self._df.get(key)
            if df is None:
                df = self._db.execute("SELECT count(*) FROM t WHERE t MATCH ?", (quote(t),)).fetchone()[0]
                self._df[key] = df
            if 0 < df <= common:
                keep.append(t)
                dfs[key] = df
        if sum(dfs.values()) > self.prune_row_budget:
            total = 0
            kept: set[str] = set()
            for key, df in sorted(dfs.items(), key=lambda kv: (kv[1], kv[0])):
                if kept and total + df > self.prune_row_budget:
                    break
                kept.add(key)
                total += df
            keep = [t for t in keep if t.casefold() in kept]
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
