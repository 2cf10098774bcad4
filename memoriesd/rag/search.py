"""Search over a vault: bm25, vector and hybrid (RRF + rerank), fragments or whole documents.

Constraints hold in every mode: ``match_mode`` all/phrase filters vector and hybrid candidates
through the BM25 index; ``cards_only``, the record filters (``--kind``, ``--category``, ``--tag``,
``--since/--until``, ``--speaker``: :mod:`memoriesd.rag.filters`) and the private/credential/file exclusions
(those records are never indexed) apply everywhere. Filters narrow the candidates of each side
before fusion: the vector search runs over the allowed fragments only, and BM25 takes enough
candidates for the share of fragments that pass, widened x4 at a time (up to the index's bound of
10,000) while too few pass; past that bound, allowed fragments that match the query are added after
them with score 0.
Relevance can be "nothing": in vector and hybrid mode a candidate stays only when BM25 matched it or its
cosine reaches the floor (``--min-score``, else the one calibrated on this vault's vectors for its model:
:mod:`memoriesd.rag.floor`, as ``rag ask`` and context packs; -1 = none),
applied after fusion so the kept candidates rank as without it (measured: no nDCG@10 change on SciFact
and XQuAD-zh with MiniLM and EmbeddingGemma; applying it to the vector side before fusion cost XQuAD-zh
0.007). When it leaves nothing, a notice says so.
Scores are higher-is-better in every mode.
With ``documents`` (`rag search`'s default) the ranked fragments are grouped by record, one hit per
document (:mod:`memoriesd.rag.documents`), and ``limit`` counts documents: the candidates are widened
x4 at a time while they hold fewer documents than that and more may match.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..embed.service import INSTALL_HINT
from ..embed.types import Cancellable, Embedder
from ..errors import ModelInputFailed, ModelUnavailable, QueryInvalid
from ..index.bm25 import MAX_CANDIDATES
from ..index.caches import VaultIndex
from ..index.docs import IndexedDoc
from ..kinds.card import KIND as CARD
from ..text.fragments import Fragment
from ..vault.live import LiveVault
from ..vault.store import VaultStore
from .documents import WIDEN, DocumentHit, document_key, group_by_document
from .engine import RagEngine
from .filters import Allowed, RecordFilter, overlaps
from .fusion import Candidate, fuse, light_rerank, order_by_scores
from .vector_view import VectorView, open_view

MODES = ("bm25", "vector", "hybrid")
MATCH_MODES = ("any", "all", "phrase")
DEFAULT_RRF_K = 60  # `rag search --rrf-k` (was [rag] rrf_k)
DEFAULT_FUSION = "convex"  # `rag search --fusion` (was [rag] fusion)


class RecordRevision(Protocol):
    """What names a record's revision: an indexed document, a context pack's item."""

    @property
    def record_id(self) -> str: ...

    @property
    def revision(self) -> int: ...


@dataclass
class SearchRequest:
    query: str
    mode: str | None = None  # None = hybrid when an embedder is available, else bm25
    limit: int = 10
    match_mode: str = "any"
    cards_only: bool = False
    rerank: bool = True
    min_score: float | None = None
    rrf_k: int | None = None
    vector_weight: float | None = None
    fusion: str | None = None  # None = DEFAULT_FUSION
    evidence_floor: bool = True  # without min_score: the model's calibrated cosine floor applies (see the module doc)
    candidates: int | None = None
    filters: RecordFilter | None = None  # --kind, --category, --tag, --since/--until, --speaker
    # Conversation fragments ranked by their own vector lifted by their best turn window
    # (memoriesd.index.vectors.windows): the answering surfaces (ask, context) set it.
    windows: bool = False
    # One hit per document (`rag search` unless --fragments): ``limit`` counts records, each hit is
    # its record's best fragment (:mod:`memoriesd.rag.documents`). ask and context packs rank fragments.
    documents: bool = False


@dataclass
class SearchOutcome:
    mode: str
    hits: list[Candidate]
    index: VaultIndex
    ignored_terms: int = 0
    notices: list[str] = field(default_factory=list)
    missing_vectors: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    # The fragments this search found, as they were when found (a change during the search
    # releases them from the index, never from a result).
    frags: dict[int, tuple[IndexedDoc, Fragment]] = field(default_factory=dict)
    # With SearchRequest.windows: the closest turn window (its index) of each conversation
    # fragment the vector side found (memoriesd.index.vectors.windows).
    best_windows: dict[int, int] = field(default_factory=dict)
    # "unit": the scores lie in [0, 1] (a cosine, or the convex fusion not rescored by a reranker
    # service), so results carry a 0-100 ``relevance``; None: raw scores (BM25, RRF, a service's).
    scale: str | None = None
    # With SearchRequest.documents: each hit's document (keyed by its best fragment's id).
    documents: dict[int, DocumentHit] | None = None
    _bodies: dict[tuple[str, int], bytes] = field(default_factory=dict)

    def line(self, doc: RecordRevision, start: int) -> int | None:
        """The 1-based line of the record body at byte ``start`` (a card's line in its source file)."""
        key = (doc.record_id, doc.revision)
        if key not in self._bodies:
            from ..errors import MemoriesError

            try:
                self._bodies[key] = self.index.store.get(doc.record_id, doc.revision).body.encode("utf-8")
            except MemoriesError:
                return None
        return self._bodies[key].count(b"\n", 0, start) + 1

    def relevance(self, score: float) -> int | None:
        return None if self.scale is None else round(100 * min(1.0, max(0.0, score)))

    def fragment(self, frag_id: int) -> tuple[IndexedDoc, Fragment] | None:
        return self.frags.get(frag_id) or self.index.get_fragment(frag_id)


def _check(req: SearchRequest) -> None:
    if not 1 <= req.limit <= 100:
        raise QueryInvalid("--limit must be between 1 and 100")
    if req.match_mode not in MATCH_MODES:
        raise QueryInvalid("--match-mode must be any, all or phrase")
    if req.mode is not None and req.mode not in MODES:
        raise QueryInvalid("--mode must be bm25, vector or hybrid")
    if req.min_score is not None and not -1.0 <= req.min_score <= 1.0:
        raise QueryInvalid("--min-score is a cosine similarity between -1 and 1")


def _allowed(idx: VaultIndex, frag_ids: list[int], req: SearchRequest, records: Allowed | None = None) -> list[int]:
    """The fragments that pass ``cards_only`` and, when given, belong to one of ``records`` (and
    overlap one of the byte ranges it names for the record: ``--speaker``)."""
    if not req.cards_only and records is None:
        return frag_ids
    out = []
    for fid in frag_ids:
        got = idx.get_fragment(fid)
        if got is None or (req.cards_only and got[0].kind != CARD):
            continue
        if records is None:
            out.append(fid)
        elif got[0].record_id in records:
            spans = records[got[0].record_id]
            if spans is None or overlaps(spans, got[1].start, got[1].end):
                out.append(fid)
    return out


def _allowed_fragments(idx: VaultIndex, req: SearchRequest, records: Allowed | None) -> set[int]:
    """Every live fragment a narrowed search may return (cards_only and/or the filters' records)."""
    assert idx.bm25 is not None
    pool = idx.live_frag_ids() if records is None else [fid for rid in records for fid in idx.bm25.frag_ids(rid)]
    return set(_allowed(idx, pool, req, records))


def _narrowed_bm25(idx: VaultIndex, req: SearchRequest, records: Allowed | None, want: int) -> tuple[list[Any], int]:
    """BM25 candidates that pass the narrowing, enough of them: ``(hits, ignored_terms)``.

    The first candidate count allows for the share of fragments that may pass (twice ``want``
    over that share: one FTS query is most of the cost, whatever its limit), then grows x4 while
    fewer than ``want`` pass and the index had more; past the index's bound, the allowed
    fragments that match the query are added with score 0.
    """
    from ..index.bm25 import Hit

    bm25 = idx.bm25
    assert bm25 is not None
    limit = min(want * 4, MAX_CANDIDATES)
    if records is not None:
        n_allowed = sum(len(bm25.frag_ids(rid)) for rid in records)
        if n_allowed == 0:
            return [], bm25.parse(req.query, req.match_mode).ignored_terms
        limit = min(MAX_CANDIDATES, max(limit, math.ceil(2 * want * max(1, idx.n_fragments()) / n_allowed)))
    while True:
        res = bm25.candidates(req.query, match_mode=req.match_mode, limit=limit)
        kept = set(_allowed(idx, [h.frag_id for h in res.hits], req, records))
        hits = [h for h in res.hits if h.frag_id in kept]
        if len(hits) >= want or len(res.hits) < limit:
            return hits, res.ignored_terms
        if limit >= MAX_CANDIDATES:
            break
        limit = min(limit * 4, MAX_CANDIDATES)
    seen = {h.frag_id for h in res.hits}
    rest = _allowed_fragments(idx, req, records) - seen
    extra = bm25.filter(req.query, req.match_mode, rest) if rest else set()
    hits += [Hit(fid, 0.0) for fid in sorted(extra)[: max(0, want - len(hits))]]
    return hits, res.ignored_terms


def _default_mode(engine: RagEngine, store: VaultStore, idx: VaultIndex | None = None, notices: list[str] | None = None) -> str:
    """hybrid when an embedding model is usable for this vault, else bm25.

    A remote embedding service is not usable for a device-only vault (unless it is on loopback):
    such a vault searches bm25 by default instead of failing with ``device_only``. Nor is a model
    that does not read the script most of the vault's text is in (:mod:`memoriesd.rag.language`):
    bm25, and a notice (into ``notices``) says why; that check needs the vault's ``idx``.
    """
    if engine.embedding.vault_source(store)[0] == "none":
        return "bm25"
    from .language import vault_fit

    fit = vault_fit(engine.embedding, store, idx, None) if idx is not None else None
    if fit is not None and fit.mismatch:
        if notices is not None:
            notices.append(fit.notice("bm25"))
        return "bm25"
    return "hybrid"


@dataclass
class _Search:
    """One search under way: the request, its settings and what each step found."""

    engine: RagEngine
    store: VaultStore
    req: SearchRequest
    ctx: Cancellable
    out: SearchOutcome
    n_cand: int
    records: Allowed | None  # the records the filters keep (None: no filter)
    bm25_ids: list[int] = field(default_factory=list)
    bm25_scores: dict[int, float] = field(default_factory=dict)
    vec_ids: list[int] = field(default_factory=list)
    cosines: dict[int, float] = field(default_factory=dict)
    embedder: Embedder | None = None
    floor: float | None = None
    view: Any = None  # the vector view (vector and hybrid), kept for a widened pass
    qvec: np.ndarray | None = None
    allowed: set[int] | None = None
    more: bool = False  # a side's candidates were cut at their bound: more fragments may match

    @property
    def narrowed(self) -> bool:
        return self.req.cards_only or self.records is not None

    @property
    def frag_limit(self) -> int:
        """How many ranked fragments a pass keeps: ``limit``, or all the candidates when grouping."""
        return max(self.n_cand, self.req.limit) if self.req.documents else self.req.limit


def run_search(engine: RagEngine, vault: LiveVault, req: SearchRequest, ctx: Cancellable) -> SearchOutcome:
    """Search an unlocked vault: lexical and vector candidates, fused, above the relevance floor, reranked."""
    store = vault.store
    _check(req)
    t0 = time.perf_counter()
    idx = engine.vault_index(vault)
    assert idx.bm25 is not None
    parsed = idx.bm25.parse(req.query, req.match_mode)  # validates the query in every mode
    notices: list[str] = []
    mode = req.mode or _default_mode(engine, store, idx, notices)
    out = SearchOutcome(mode=mode, hits=[], index=idx, ignored_terms=parsed.ignored_terms, notices=notices)
    # Fragments of records the filters leave out are never candidates.
    records = req.filters.allowed_records(store) if req.filters is not None and req.filters.active else None
    s = _Search(engine, store, req, ctx, out, req.candidates or engine.config.search.candidates, records)
    out.timings["index_ms"] = (time.perf_counter() - t0) * 1000
    _rank(s)
    if req.documents:
        _documents_step(s)
    out.timings["total_ms"] = (time.perf_counter() - t0) * 1000
    return out


def _rank(s: _Search) -> None:
    """One pass of the steps: candidates of each side (``s.n_cand`` of them), fused, above the floor, reranked."""
    mode, out = s.out.mode, s.out
    s.more = False
    if mode in ("bm25", "hybrid"):
        _lexical(s)
    if mode in ("vector", "hybrid"):
        if s.view is None:
            _vector(s)
        else:
            _nearest(s)  # a widened pass: the query vector and floor stay
    _collect(s)
    if mode == "bm25":
        out.hits = _bm25_hits(s)
    elif mode == "vector":
        out.hits = _vector_hits(s)
    else:
        out.hits = _rerank_step(s, _above_floor(_fuse(s), s.floor, out))


def _documents_step(s: _Search) -> None:
    """One hit per document: the ranked fragments grouped by record (:mod:`memoriesd.rag.documents`),
    the candidates widened and ranked again while they hold fewer than ``limit`` documents and a
    side was cut at its bound (so more fragments may match), up to the index's bound."""
    t = time.perf_counter()
    out, limit = s.out, s.req.limit

    def record_of(fid: int) -> str | None:
        got = out.frags.get(fid)
        return None if got is None else document_key(got[0], fid)

    groups = group_by_document(out.hits, record_of)
    while len(groups) < limit and s.more and s.n_cand < MAX_CANDIDATES:
        s.ctx.check_cancelled()
        s.n_cand = min(MAX_CANDIDATES, s.n_cand * WIDEN)
        _rank(s)
        groups = group_by_document(out.hits, record_of)
    groups = groups[:limit]
    out.hits = [g.best for g in groups]
    out.documents = {g.best.frag_id: g for g in groups}
    out.timings["documents_ms"] = (time.perf_counter() - t) * 1000


def _lexical(s: _Search) -> None:
    """BM25 candidates: ``limit`` of them for a plain bm25 search, else enough for fusion."""
    t = time.perf_counter()
    req, idx, out = s.req, s.out.index, s.out
    assert idx.bm25 is not None
    want = s.frag_limit if (out.mode == "bm25" and not s.narrowed) else max(s.n_cand, req.limit)
    if s.narrowed:
        hits, out.ignored_terms = _narrowed_bm25(idx, req, s.records, want)
    else:
        res = idx.bm25.candidates(req.query, match_mode=req.match_mode, limit=min(want, MAX_CANDIDATES))
        out.ignored_terms, hits = res.ignored_terms, res.hits
    s.more = s.more or len(hits) >= want
    s.bm25_ids = [h.frag_id for h in hits]
    s.bm25_scores = {h.frag_id: h.score for h in hits}
    out.timings["bm25_ms"] = (time.perf_counter() - t) * 1000


def _vector(s: _Search) -> None:
    """Vector candidates: missing vectors embedded on demand (:mod:`memoriesd.rag.vector_view`), then
    the nearest allowed fragments; ``match_mode`` all/phrase keeps those BM25 also matches."""
    t = time.perf_counter()
    engine, req, out, idx = s.engine, s.req, s.out, s.out.index
    if not engine.embedding.available():
        raise ModelUnavailable(f"--mode {out.mode} needs an embedding model: {INSTALL_HINT}")
    view = open_view(engine, s.store, idx)
    s.embedder = view.embedder
    _language_notice(s, view)
    coverage = view.ensure(s.ctx, limit=engine.config.search.on_demand_embed_limit)
    if (notice := coverage.notice()) is not None:
        out.missing_vectors = coverage.left
        out.notices.append(notice)
    t_embed = time.perf_counter()
    try:
        qvec: np.ndarray | None = view.query_vector(req.query, s.ctx)
        out.timings["query_embed_ms"] = (time.perf_counter() - t_embed) * 1000  # part of vector_ms
    except ModelInputFailed:
        if out.mode != "hybrid":
            raise
        qvec = None  # the model cannot read this query: hybrid answers from bm25 alone, and says so
        out.notices.append("the embedding model could not read this query, so only lexical (bm25) results are shown")
    allowed = _allowed_fragments(idx, req, s.records) if s.narrowed else None
    s.floor = _floor(engine, view, req)
    s.view, s.qvec, s.allowed = view, qvec, allowed
    _nearest(s)
    out.timings["vector_ms"] = (time.perf_counter() - t) * 1000


def _nearest(s: _Search) -> None:
    """The nearest allowed fragments to the query vector (``s.n_cand`` of them); ``match_mode``
    all/phrase keeps those BM25 also matches."""
    req, out, idx, view, qvec = s.req, s.out, s.out.index, s.view, s.qvec
    k = max(s.n_cand, req.limit)
    pairs = [] if qvec is None else view.search(qvec, k, allowed=s.allowed, windows=req.windows,
                                                 best_windows=out.best_windows)
    # Cut at k with the last still above the floor: nearer ones below k may pass too.
    s.more = s.more or (len(pairs) >= k and (s.floor is None or pairs[-1][1] >= s.floor))
    if req.match_mode != "any" and pairs:
        assert idx.bm25 is not None
        keep = idx.bm25.filter(req.query, req.match_mode, [fid for fid, _ in pairs])
        pairs = [(fid, score) for fid, score in pairs if fid in keep]
    s.vec_ids = [fid for fid, _ in pairs]
    s.cosines = dict(pairs)


def _language_notice(s: _Search, view: VectorView) -> None:
    """A vector or hybrid search of a vault its model does not read says so (the model is measured
    here on first use when its profile does not name its scripts)."""
    from .language import vault_fit

    fit = vault_fit(s.engine.embedding, s.store, s.out.index, view.embedder)
    if fit is not None and fit.mismatch:
        s.out.notices.append(fit.notice(s.out.mode))


def _collect(s: _Search) -> None:
    """Keep the candidates' fragments as they are now (a change during the search releases them
    from the index, never from a result); candidates gone meanwhile are dropped."""
    out = s.out
    for fid in set(s.bm25_ids) | set(s.vec_ids):
        got = out.index.get_fragment(fid)
        if got is not None:
            out.frags[fid] = got
    s.bm25_ids = [fid for fid in s.bm25_ids if fid in out.frags]
    s.vec_ids = [fid for fid in s.vec_ids if fid in out.frags]


def _bm25_hits(s: _Search) -> list[Candidate]:
    frags = s.out.frags
    return [
        Candidate(frag_id=fid, score=s.bm25_scores[fid], bm25_rank=i + 1, text=frags[fid][1].text, title=frags[fid][0].title)
        for i, fid in enumerate(s.bm25_ids[: s.frag_limit])
    ]


def _vector_hits(s: _Search) -> list[Candidate]:
    frags = s.out.frags
    hits = [
        Candidate(frag_id=fid, score=s.cosines[fid], vector_rank=i + 1, cosine=s.cosines[fid], text=frags[fid][1].text,
                  title=frags[fid][0].title)
        for i, fid in enumerate(s.vec_ids)
    ]
    s.out.scale = "unit"
    return _above_floor(hits, s.floor, s.out)[: s.frag_limit]


def _fuse(s: _Search) -> list[Candidate]:
    """Hybrid: the two candidate lists fused (``--fusion``: RRF or convex)."""
    frags, req, engine = s.out.frags, s.req, s.engine
    texts = {fid: got[1].text for fid, got in frags.items()}
    titles = {fid: got[0].title for fid, got in frags.items()}
    method = req.fusion or DEFAULT_FUSION
    if method == "convex" and not (req.rerank and engine.config.rerank.configured):
        s.out.scale = "unit"
    return fuse(
        s.bm25_ids[: s.n_cand], s.vec_ids[: s.n_cand], k=req.rrf_k or DEFAULT_RRF_K, cosines=s.cosines,
        texts=texts, titles=titles, vector_weight=req.vector_weight or engine.embedding.vector_weight(s.embedder),
        method=method, bm25_scores=s.bm25_scores,
    )


def _rerank_step(s: _Search, fused: list[Candidate]) -> list[Candidate]:
    t = time.perf_counter()
    s.more = s.more or len(fused) > s.n_cand
    if s.req.rerank and fused:
        # A widened pass (one hit per document) reranks the first candidates only, as the first pass
        # did (a reranker service is not sent thousands of texts); the rest follow in fused order.
        first = s.req.candidates or s.engine.config.search.candidates
        head = rerank(s.engine, s.store, s.req.query, fused[: min(first, s.n_cand)], s.ctx, embedder=s.embedder)
        fused = head + fused[min(first, s.n_cand) : s.n_cand]
    s.out.timings["rerank_ms"] = (time.perf_counter() - t) * 1000
    return fused[: s.frag_limit]


def _floor(engine: RagEngine, view: VectorView, req: SearchRequest) -> float | None:
    """The cosine a candidate BM25 did not match needs: ``--min-score``, else (``evidence_floor``)
    ``[search] min_cosine`` when set, else the floor calibrated on this vault's vectors for its model
    (:mod:`memoriesd.rag.floor`; the profile's constant while the vault has too few vectors);
    None = no floor (-1)."""
    floor = req.min_score
    if floor is None and req.evidence_floor:
        floor = engine.embedding.configured_floor()
        if floor is None:
            from .floor import vault_floor

            cal = vault_floor(view)
            floor = cal.floor if cal is not None else engine.embedding.evidence_floor(view.embedder)
    return None if floor is None or floor <= -1.0 else floor


def _above_floor(cands: list[Candidate], floor: float | None, out: SearchOutcome) -> list[Candidate]:
    """The candidates BM25 matched or whose cosine reaches ``floor``, in their order; when the floor
    leaves none, a notice says why (so an empty result is not read as a broken search)."""
    if floor is None:
        return cands
    kept = [c for c in cands if c.bm25_rank is not None or (c.cosine is not None and c.cosine >= floor)]
    if cands and not kept:
        best = max((c.cosine for c in cands if c.cosine is not None), default=-1.0)
        words = "no fragment matches the query's words, and " if out.mode == "hybrid" else ""
        out.notices.append(
            f"{words}none is close enough in meaning: the nearest fragment has cosine {best:.2f}, under the relevance "
            f"floor {floor:.2f} (calibrated on this vault for its embedding model unless --min-score or [search] "
            "min_cosine sets it); `memories rag search --min-score -1` shows the nearest fragments anyway"
        )
    return kept


def rerank(
    engine: RagEngine, store: VaultStore, query: str, candidates: list[Candidate], ctx: Cancellable, *,
    embedder: Embedder | None = None,
) -> list[Candidate]:
    """The trained reranker service when configured, else the light heuristic where it helps.

    The light heuristic runs unless the embedding model's profile turns it off (it was measured to cost quality with a strong model: docs/benchmarks.md).
    """
    svc = engine.config.rerank
    if svc.configured:
        from .rerank import remote_rerank

        engine.check_remote_policy(store, svc.url, "rerank")
        scores = remote_rerank(engine.http_client(), svc, query, [c.text for c in candidates], os.environ, before_attempt=engine.operation_check(store, ctx))
        return order_by_scores(candidates, scores)
    profile = embedder.profile if embedder is not None else None
    if profile is not None and not profile.light_rerank:
        return candidates
    from ..text.segment import query_terms

    return light_rerank(query_terms(query), candidates)
