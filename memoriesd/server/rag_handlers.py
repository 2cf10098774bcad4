"""Protocol methods for ingestion, search, indexing, status, ask and model-install."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import Cancelled, ModelUnavailable
from ..rag.engine import INSTALL_HINT, RagEngine
from ..rag.search import MATCH_MODES, MODES, SearchRequest, document_results, fragment_results, run_search
from ..vault.store import VaultStore
from .context import Context
from .handlers import method


def _engine(app: Any) -> RagEngine:
    return app.rag


def _store(app: Any, ctx: Context) -> VaultStore:
    return app.vaults.store(ctx.params.text("vault", allow_empty=False))


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
        candidates=p.integer("candidates", None, lo=1, hi=10000),
    )


@method("memory.search")
def memory_search(app: Any, ctx: Context) -> dict[str, Any]:
    """Lexical, grouped by document (one line per record)."""
    store = _store(app, ctx)
    req = _search_request(ctx)
    limit = req.limit
    req.mode = req.mode or "bm25"
    if not 1 <= limit <= 100:
        req.limit = limit  # let run_search report the range error
    else:
        req.limit = 100
    out = run_search(_engine(app), store, req, ctx)
    return {"mode": out.mode, "results": document_results(out, limit), "ignored_terms": out.ignored_terms, "notices": out.notices}


@method("rag.search")
def rag_search(app: Any, ctx: Context) -> dict[str, Any]:
    store = _store(app, ctx)
    req = _search_request(ctx)
    out = run_search(_engine(app), store, req, ctx)
    return {
        "mode": out.mode,
        "results": fragment_results(out),
        "ignored_terms": out.ignored_terms,
        "notices": out.notices,
        "missing_vectors": out.missing_vectors,
        "timings_ms": {k: round(v, 3) for k, v in out.timings.items()},
    }


@method("rag.ingest")
def rag_ingest(app: Any, ctx: Context) -> dict[str, Any]:
    from ..rag.ingest import IngestRequest, run_ingest

    store = _store(app, ctx)
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
    max_bytes = int(app.config.rag.max_document_mib * 1024 * 1024)
    return run_ingest(store, req, ctx, max_bytes=max_bytes).to_dict()


@method("rag.status")
def rag_status(app: Any, ctx: Context) -> dict[str, Any]:
    return _engine(app).status(_store(app, ctx))


@method("rag.index")
def rag_index(app: Any, ctx: Context) -> dict[str, Any]:
    """Embed fragments that lack a vector, within the operation budget; returns how far it got."""
    engine = _engine(app)
    store = _store(app, ctx)
    if not engine.embedding_available():
        raise ModelUnavailable(f"no embedding model is available: {INSTALL_HINT}")
    budget = ctx.params.number("budget_seconds", app.config.rag.operation_budget_seconds)
    budget = max(0.1, min(budget, app.config.rag.operation_budget_seconds))
    idx = engine.vault_index(store)
    embedder = engine.embedder()
    space = engine.vector_space(store, idx, embedder)
    missing = space.missing(idx)
    total = idx.n_fragments()
    already = total - len(missing)
    t0 = time.monotonic()
    kept = [0]
    generation = store.generation

    def progress(done: int) -> None:
        kept[0] = done
        ctx.send_progress({"done": already + done, "total": total})

    changed = False
    try:
        embedded = engine.embed_missing(
            store, idx, space, embedder, missing, ctx, deadline=t0 + budget, progress=progress
        )
    except Cancelled:
        if store.closed or store.generation == generation:
            raise  # locked or the client went away: the pass is over
        # The vault changed under the pass: finished batches are kept, the in-flight one was dropped,
        # and the caller starts the next pass on the new content (the CLI does so by itself).
        embedded, changed = kept[0], True
    return {
        "embedded": embedded,
        "remaining": len(missing) - embedded,
        "total": total,
        "model": space.identity,
        "seconds": round(time.monotonic() - t0, 3),
        "changed": changed,
    }


@method("rag.ask")
def rag_ask(app: Any, ctx: Context) -> dict[str, Any]:
    from ..rag.answer import ask

    store = _store(app, ctx)
    req = _search_request(ctx, query_key="question", default_limit=8)
    return ask(_engine(app), store, req.query, req, ctx)


@method("rag.model_install")
def rag_model_install(app: Any, ctx: Context) -> dict[str, Any]:
    from ..embed.install import default_manifest_path, install_model, load_manifest

    target = ctx.params.text("dir", None)
    dest = Path(target) if target else app.home.models / "embeddinggemma"
    manifest = load_manifest(default_manifest_path())
    base = app.config.rag.model_download_base_url or None

    def cancel() -> None:
        ctx.check_cancelled()

    report = install_model(manifest, dest, base_url=base, http=app.config.rag.http, progress=ctx.send_progress, cancel=cancel)
    out = report.to_dict()
    out["dir"] = str(dest)
    if dest != _engine(app).model_dir():
        out["notice"] = f"set [rag] local_model_dir = \"{dest}\" in config.toml to use this copy"
    else:
        out["notice"] = "restart the daemon (`memories daemon stop`) if it had loaded other model files"
    return out
