"""Protocol methods for ingestion, search, indexing, status, ask and model-install."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import Cancelled, MemoriesError, ModelUnavailable, NotFound, VaultLocked
from ...index.bm25 import MAX_CANDIDATES
from ...index.caches import VaultIndex
from ...memory.recalls import note_recalls
from ...rag.engine import INSTALL_HINT, RagEngine
from ...rag.filters import RecordFilter, make_filter
from ...rag.fusion import FUSIONS, Candidate
from ...rag.results import document_results, fragment_results
from ...rag.search import MATCH_MODES, MODES, SearchRequest, run_search
from ...rag.vector_view import open_view
from ...text.fragments import Fragment
from ...vault.live import VaultLock
from ...vault.store import VaultStore
from ..config_watch import name_config_path
from ..context import Context, Params
from ..method import Method

if TYPE_CHECKING:
    from ..app import App
def _engine(app: App) -> RagEngine:
    return app.rag



def _search_request(ctx: Context, *, query_key: str = "query", default_limit: int = 10) -> SearchRequest:
    p = ctx.params
    return SearchRequest(
        query=p.text(query_key),
        mode=p.choice("mode", MODES, None),
        limit=p.integer("limit", default_limit),
        match_mode=p.choice("match_mode", MATCH_MODES, "any"),
        cards_only=p.flag("cards_only", False),
        rerank=not p.flag("no_rerank", False),
        min_score=p.number("min_score", None),
        rrf_k=p.integer("rrf_k", None, lo=1, hi=1000),
        vector_weight=_weight(p.number("vector_weight", None)),
        fusion=p.choice("fusion", FUSIONS, None),
        candidates=p.integer("candidates", None, lo=1, hi=10000),
        filters=search_filter(p),
    )


def search_filter(p: Params) -> RecordFilter:
    """``kinds``, ``categories``, ``tags``, ``speakers`` (lists), ``since`` and ``until`` (ISO dates) of a request."""
    return make_filter(
        p.texts("kinds", []),
        p.texts("categories", []),
        p.texts("tags", []),
        p.text("since", None, max_len=40),
        p.text("until", None, max_len=40),
        p.texts("speakers", []),
    )


def _weight(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 100:
        from ...errors import QueryInvalid

        raise QueryInvalid("--vector-weight must be above 0 and at most 100")
    return value


#: ``memory search`` reads this many fragments first, then widens by ``_WIDEN`` up to the index's bound.
_FIRST_FRAGMENTS = 100
_WIDEN = 4


def _searchable(store: VaultStore, record_id: str, cards_only: bool, flt: RecordFilter | None = None) -> bool:
    """What a grant's result filter would keep too: live, not private, not a credential or file
    (and what the request's filters keep)."""
    try:
        rec = store.get(record_id)
    except NotFound:
        return False
    return rec.searchable and (not cards_only or rec.kind == "card") and (flt is None or flt.keeps(rec))


def _speaker_fragment(store: VaultStore, record_id: str, frag: Fragment, flt: RecordFilter) -> bool:
    """Whether this fragment of a record holds a turn by one of the filter's speakers."""
    try:
        return flt.keeps_fragment(store.get(record_id), frag.start, frag.end)
    except NotFound:
        return False


def _best_per_record(
    store: VaultStore, idx: VaultIndex, hits: list[Candidate], limit: int, cards_only: bool, flt: RecordFilter | None = None
) -> list[Candidate]:
    """Each record's best hit, in rank order, for the first ``limit`` searchable records."""
    best: dict[str, Candidate] = {}
    skipped: set[str] = set()
    for c in hits:
        got = idx.get_fragment(c.frag_id)
        if got is None:  # changed during the search
            continue
        record_id = got[0].record_id
        if record_id in best or record_id in skipped:
            continue
        if not _searchable(store, record_id, cards_only, flt):
            skipped.add(record_id)
            continue
        if flt is not None and flt.speakers and not _speaker_fragment(store, record_id, got[1], flt):
            continue  # --speaker: another fragment of the record may still be by them
        best[record_id] = c
        if len(best) >= limit:
            break
    return list(best.values())


def memory_search(app: App, ctx: Context) -> dict[str, Any]:
    """Lexical, grouped by document (one line per record).

    A few long records can fill the first fragments, so (in bm25 mode, the default) the candidates
    are widened until ``limit`` distinct records are found or every match was seen, up to the
    index's bound of 10,000 fragments.
    Records a grant may not see are skipped here, so they do not take the place of visible ones.
    """
    vault = app.lease(ctx)
    store = vault.store
    req = _search_request(ctx)
    limit = req.limit
    req.mode = req.mode or "bm25"
    if 1 <= limit <= 100:  # else run_search reports the range error
        req.limit = _FIRST_FRAGMENTS
    out = run_search(_engine(app), vault, req, ctx)
    hits = _best_per_record(store, out.index, out.hits, limit, req.cards_only, req.filters)
    bm25 = out.index.bm25
    fetched = _FIRST_FRAGMENTS
    # Without cards_only, fewer hits than asked for means every match was seen; with it, run_search
    # filtered an unknown number of candidates, so the wider pass finds out.
    more = req.cards_only or bool(req.filters and req.filters.active) or len(out.hits) >= _FIRST_FRAGMENTS
    while out.mode == "bm25" and bm25 is not None and len(hits) < limit and more and fetched < MAX_CANDIDATES:
        ctx.check_cancelled()
        fetched = min(fetched * _WIDEN, MAX_CANDIDATES)
        res = bm25.candidates(req.query, match_mode=req.match_mode, limit=fetched)
        out.ignored_terms = res.ignored_terms
        wide = [Candidate(frag_id=h.frag_id, score=h.score, bm25_rank=i + 1) for i, h in enumerate(res.hits)]
        hits = _best_per_record(store, out.index, wide, limit, req.cards_only, req.filters)
        more = len(res.hits) >= fetched
    out.hits = hits
    results = document_results(out, limit)
    note_recalls(vault, [r["id"] for r in results])  # a fact found is a fact recalled
    return {"mode": out.mode, "results": results, "ignored_terms": out.ignored_terms, "notices": out.notices}


def rag_search(app: App, ctx: Context) -> dict[str, Any]:
    """One hit per document (record) by default, ``limit`` of them; ``fragments: true``: the ranked
    fragments themselves, several of one document among them (docs/search.md)."""
    vault = app.lease(ctx)
    req = replace(_search_request(ctx), documents=not ctx.params.flag("fragments", False))
    out = run_search(_engine(app), vault, req, ctx)
    results = fragment_results(out)
    note_recalls(vault, [r["record_id"] for r in results])  # a fact found is a fact recalled
    return {
        "mode": out.mode,
        "grouping": "document" if req.documents else "fragment",
        "results": results,
        "ignored_terms": out.ignored_terms,
        "notices": out.notices,
        "missing_vectors": out.missing_vectors,
        "timings_ms": {k: round(v, 3) for k, v in out.timings.items()},
    }


def rag_ingest(app: App, ctx: Context) -> dict[str, Any]:
    from ...rag.ingest import IngestRequest, run_ingest

    vault = app.lease(ctx)

    store = vault.store
    p = ctx.params
    req = IngestRequest(
        paths=p.texts("paths", []),
        recursive=p.flag("recursive", False),
        title=p.text("title", None, max_len=1000),
        tags=p.texts("tags", []),
        private=p.flag("private", False),
        prune=p.flag("prune", False),
        text=p.text("text", None),
    )
    max_bytes = int(app.config.vault.max_document_mib * 1024 * 1024)
    # One ingest at a time per vault: two ingests of one folder must not make two cards of a file.
    with vault.hold(VaultLock.INGEST):
        report = run_ingest(store, req, ctx, max_bytes=max_bytes).to_dict()
    if report["added"] or report["updated"]:
        _engine(app).background.request(store.vault_id)
    return report


def rag_status(app: App, ctx: Context) -> dict[str, Any]:
    vault = app.lease(ctx)
    store = vault.store
    out = _engine(app).status(store)
    if out.get("cap_error"):  # a cap error shown inside the status names the config file, as an error frame does
        out["cap_error"] = name_config_path(out["cap_error"], app.home.config_path, "cap_exceeded")
    out["watch"] = app.watch.status(store.vault_id)  # watched folders: state, last sync, pending, counts
    return out


def rag_watch_reload(app: App, ctx: Context) -> dict[str, Any]:
    """Apply the ``[[watch.folder]]`` tables of config.toml now (`rag watch` / `rag unwatch` call it)."""
    return app.watch.reload()


def rag_index(app: App, ctx: Context) -> dict[str, Any]:
    """Embed fragments that lack a vector, within the operation budget; returns how far it got."""
    engine = _engine(app)
    vault = app.lease(ctx)
    store = vault.store
    if not engine.embedding.available():
        raise ModelUnavailable(f"no embedding model is available: {INSTALL_HINT}")
    budget = ctx.params.number("budget_seconds", app.config.index.budget_seconds)
    budget = max(0.1, min(budget, app.config.index.budget_seconds))
    if engine.background.enabled():
        return _attach_to_background(engine, store, ctx, budget)
    view = open_view(engine, store, engine.vault_index(vault))
    missing = view.missing()
    total = view.total
    already = total - len(missing)
    t0 = time.monotonic()
    kept = [0]
    generation = store.generation

    def progress(done: int) -> None:
        kept[0] = done
        ctx.send_progress({"done": already + done, "total": total})

    changed = False
    try:
        embedded = view.ensure(ctx, limit=None, deadline=t0 + budget, progress=progress).embedded
    except Cancelled:
        if store.closed or store.generation == generation:
            raise  # locked or the client went away: the pass is over
        # The vault changed under the pass: finished batches are kept, the in-flight one was dropped,
        # and the caller starts the next pass on the new content (the CLI does so by itself).
        embedded, changed = kept[0], True
    idx, space = view.idx, view.space
    skipped = len(space.skipped)
    return {
        "embedded": embedded,
        "remaining": max(0, len(space.missing(idx)) if not changed else len(missing) - embedded),
        "skipped": skipped,
        "total": total,
        "fragments": idx.n_fragments(),  # the rest of total: conversation turn windows
        "model": space.identity,
        "seconds": round(time.monotonic() - t0, 3),
        "changed": changed,
    }


def _attach_to_background(engine: RagEngine, store: VaultStore, ctx: Context, budget: float) -> dict[str, Any]:
    """`rag index` with the background indexer on: put the vault first and follow its job (progress
    with rate and ETA) until it is done or the budget is spent, instead of a second pass beside it."""
    t0 = time.monotonic()
    engine.background.request(store.vault_id, first=True)
    start = engine.background.job(store.vault_id)
    before = start.embedded if start is not None else 0
    job = start
    while time.monotonic() - t0 < budget:
        ctx.check_cancelled()
        job = engine.background.wait(store.vault_id, min(1.0, budget - (time.monotonic() - t0)))
        if job is None:
            break
        ctx.send_progress({"done": job.embedded, "total": job.total, "rate": job.rate, "eta_seconds": job.eta_seconds})
        if job.state not in ("queued", "running"):
            break
    if job is None:
        raise ModelUnavailable(f"no embedding model is available: {INSTALL_HINT}")
    if job.state == "failed":
        raise MemoriesError(f"background indexing stopped: {job.error}", code="index_stalled")
    if job.state == "paused":
        raise VaultLocked(f"vault {store.name} was locked: the indexing resumes after `memories vault unlock {store.name}`")
    idx = engine.peek_index(store)
    model = idx.vectors.identity if idx is not None and idx.vectors is not None else ""
    return {
        "embedded": max(0, job.embedded - before),
        "remaining": job.remaining,
        "skipped": job.skipped,
        "total": job.total,
        "fragments": idx.n_fragments() if idx is not None else job.total,  # the rest of total: turn windows
        "model": model,
        "seconds": round(time.monotonic() - t0, 3),
        "changed": False,
    }


def rag_ask(app: App, ctx: Context) -> dict[str, Any]:
    from ...rag.ask import ask

    vault = app.lease(ctx)
    req = replace(_search_request(ctx, query_key="question", default_limit=8), windows=True)  # an answering surface
    out = ask(_engine(app), vault, req.query, req, ctx)
    note_recalls(vault, [c["record_id"] for c in out.get("citations", [])])
    return out


def rag_model_install(app: App, ctx: Context) -> dict[str, Any]:
    from ...embed.install import default_manifest_path, install_model, load_manifest

    target = ctx.params.text("dir", None)
    dest = Path(target) if target else app.home.models / "embeddinggemma"
    manifest = load_manifest(default_manifest_path())
    base = app.config.embedding.local.download_url or None

    def cancel() -> None:
        ctx.check_cancelled()

    report = install_model(manifest, dest, base_url=base, http=app.config.http, progress=ctx.send_progress, cancel=cancel)
    out = report.to_dict()
    out["dir"] = str(dest)
    if dest != _engine(app).embedding.model_dir():
        out["notice"] = (
            f"set [embedding.local] model_dir = \"{dest}\" in {app.home.config_path} and run `memories daemon restart` "
            "to use this copy"
        )
    else:
        out["notice"] = "run `memories daemon restart` if the daemon had loaded other model files"
    return out


#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.search", memory_search, scope="search", owner_only=False, grant_params=('query', 'limit', 'match_mode', 'cards_only')),
    Method("rag.search", rag_search, scope="retrieve", owner_only=False, grant_params=('query', 'mode', 'limit', 'match_mode', 'no_rerank', 'min_score', 'cards_only', 'fragments')),
    Method("rag.ingest", rag_ingest),
    Method("rag.status", rag_status),
    Method("rag.watch_reload", rag_watch_reload, route="both"),
    Method("rag.index", rag_index),
    Method("rag.ask", rag_ask, scope="ask", owner_only=False, grant_params=('question', 'mode', 'limit', 'match_mode', 'no_rerank', 'cards_only')),
    Method("rag.model_install", rag_model_install, route="both"),
]
