"""``rag status`` of one vault: its index, its embedder and how far its vectors are.

Nothing here builds an index or loads a model: counts come from what is loaded, else from the
sealed vectors on disk (:func:`memoriesd.index.vectors.maintenance.sealed_status`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..embed.service import INSTALL_HINT
from ..errors import CapExceeded
from ..index.vectors.maintenance import sealed_status
from .vector_view import ViewEngine

if TYPE_CHECKING:
    from ..index.caches import IndexCache, VaultIndex
    from ..vault.records import Record
    from ..vault.store import VaultStore
    from .background import BackgroundIndexer


class StatusEngine(ViewEngine, Protocol):
    """What ``rag status`` reads of the retrieval engine (:class:`memoriesd.rag.engine.RagEngine`)."""

    @property
    def cache(self) -> IndexCache: ...

    @property
    def background(self) -> BackgroundIndexer: ...

    def peek_index(self, store: VaultStore) -> VaultIndex | None: ...


def vault_status(engine: StatusEngine, store: VaultStore) -> dict[str, Any]:
    config = engine.config
    idx = engine.peek_index(store)
    cards = [r for r in store.latest() if r.kind == "card"]
    searchable = [r for r in store.latest() if r.searchable]
    if idx is None or idx.bm25 is None:
        state = "none"
    elif idx.generation != store.generation:
        state = "stale"
    else:
        state = "built"
    service = engine.embedding
    out: dict[str, Any] = {
        "vault_id": store.vault_id,
        "documents": len(cards),
        "searchable_records": len(searchable),
        "bytes": sum(len(r.body.encode("utf-8")) for r in cards),
        "index": state,
        "fragments": idx.n_fragments() if idx is not None and idx.bm25 is not None else None,
        "cache": {
            "source_bytes": idx.source_bytes if idx is not None else 0,
            "max_fragments": config.index.max_fragments,
            "max_source_mib": config.index.max_source_mib,
            "max_vector_mib": config.index.max_vector_mib,
            "max_vaults": engine.cache.max_vaults,
            "cached_vaults": len(engine.cache.cached_ids()),
        },
        "embedding": {"available": service.available()},
    }
    # Which embedder serves this vault (local, remote or none) and why: [embedding] source.
    served_by, reason = service.vault_source(store)
    out["embedding"].update({"served_by": served_by, "reason": reason})
    if out["fragments"] is None:
        _unbuilt_counts(engine, searchable, out)
    _embedding_status(engine, store, idx, out["embedding"])
    _background_status(engine, store, out["embedding"])
    _language_status(engine, store, idx, searchable, out)
    return out


def _language_status(engine: StatusEngine, store: VaultStore, idx: VaultIndex | None, searchable: list[Record],
                     out: dict[str, Any]) -> None:
    """The vault's script against its model's (:mod:`memoriesd.rag.language`): ``embedding.language``, the
    default search mode, and a notice when the model does not read the vault's text (nothing is loaded)."""
    from .language import SAMPLE_CHARS, SAMPLE_FRAGMENTS, vault_fit

    step = max(1, len(searchable) // SAMPLE_FRAGMENTS)

    def texts() -> list[str]:
        return [r.body[:SAMPLE_CHARS] for r in searchable[::step][:SAMPLE_FRAGMENTS]]

    fit = vault_fit(engine.embedding, store, idx, None, texts=texts, count=len(searchable))
    emb = out["embedding"]
    if out["embedding"].get("served_by") in (None, "none") or not emb.get("available"):
        emb["default_mode"] = "bm25"
    else:
        emb["default_mode"] = "bm25" if fit is not None and fit.mismatch else "hybrid"
    if fit is not None:
        emb["language"] = fit.as_dict()
        if fit.mismatch:
            out["notices"] = [fit.notice("bm25")]


def _unbuilt_counts(engine: StatusEngine, searchable: list[Record], out: dict[str, Any]) -> None:
    """No index yet: count what it would hold without building it (state stays "none")."""
    from ..index.docs import check_caps
    from ..kinds.registry import kind_of
    from ..text.fragments import split_fragments

    n_frags = 0
    size = 0
    for r in searchable:
        frags = split_fragments(r.id, r.revision, r.body, bytes(32), skip=kind_of(r.kind).body_start(r))
        n_frags += max(1, len(frags)) if r.title.strip() or frags else 0
        size += len(r.title.encode("utf-8")) + len(r.body.encode("utf-8"))
    out["fragments"] = n_frags
    out["cache"]["source_bytes"] = size
    try:
        check_caps(n_frags, size, engine.config.index)
    except CapExceeded as exc:
        out["index"] = "over_cap"
        out["cap_error"] = exc.message


def _embedding_status(engine: StatusEngine, store: VaultStore, idx: VaultIndex | None, emb: dict[str, Any]) -> None:
    service = engine.embedding
    available = service.available()
    if available:
        emb["source"] = service.describe()  # the model directory or remote service
    if idx is not None and idx.vectors is not None:
        space = idx.vectors
        emb.update(
            {
                "model": space.identity,
                "dimensions": space.dims,
                "embedded": len(space.index),
                "total": idx.n_vectors(space.windows),
                "skipped": len(space.skipped),
                "vector_bytes": space.nbytes,
                "vectors_loaded": True,
            }
        )
    elif available:
        emb["model"] = service.describe()
        emb["embedded"] = None
        emb["vectors_loaded"] = False
        # Not loaded yet (unlock, restart): count the sealed vectors of live fragments instead.
        identity, dims = service.known_identity()
        sealed = sealed_status(store, identity=identity, dims=dims, remote=service.remote(),
                               windows=engine.config.index.conversation_windows)
        if sealed is not None:
            emb.update(sealed)
    else:
        emb["hint"] = INSTALL_HINT


def _background_status(engine: StatusEngine, store: VaultStore, emb: dict[str, Any]) -> None:
    """``state`` (running, queued, paused, done, failed, off), ``rate`` (fragments/s) and ``eta_seconds``."""
    emb.setdefault("skipped", 0)
    background = engine.background
    job = background.job(store.vault_id) if background.enabled() else None
    if job is None:
        if not background.enabled():
            state = "off"
        elif emb.get("embedded") is not None and emb.get("total") is not None and emb["embedded"] + emb["skipped"] >= emb["total"]:
            state = "done"
        else:
            state = "idle"
        emb.update({"state": state, "rate": None, "eta_seconds": None})
        return
    view = job.view()
    emb.update({"state": view["state"], "rate": view["rate"], "eta_seconds": view["eta_seconds"]})
    if view["error"]:
        emb["error"] = view["error"]


def embedding_progress(engine: StatusEngine, store: VaultStore) -> dict[str, Any]:
    """The ``embedding`` part of :func:`vault_status` alone (no fragment count of an unbuilt index):
    ``memories status`` shows it for every vault at once."""
    emb: dict[str, Any] = {"available": engine.embedding.available()}
    _embedding_status(engine, store, engine.peek_index(store), emb)
    _background_status(engine, store, emb)
    return emb


__all__ = ["vault_status", "embedding_progress"]
