"""Forgetting for real: a record goes with every revision and everything derived from it.

What is chosen (:func:`select_ids`, :func:`select_all`, :func:`select_query`):

- ``--id ID...``: those records (any kind, deleted ones too: their revisions are still in the log);
- ``--query Q --scope topic``: every searchable record on the topic, that is one whose current
  text has every term of the query (BM25, ``all`` mode, stemmed), or whose best fragment has a
  cosine to the query of at least the model's ``forget_min_cosine`` (calibrated per model:
  docs/memory.md, "Forget"), or one of whose earlier revisions has every word of the query;
- ``--query Q --scope specific``: the best of those: the first of the hybrid search's ranking
  that is on the topic (else the closest by cosine, then by BM25, then by history);
- ``--all``: every fact (``--kind K``: every record of that kind).

What :func:`purge` does, in this order: a deletion of each record is committed; the log is
compacted into a new epoch that holds no entry of the forgotten records (nor of records deleted
earlier), every other record keeping all its revisions, and the old log file is removed; every
sealed vector sidecar is rewritten to the vectors of live fragments (a sidecar whose model the
vault no longer names cannot be filtered, so it is removed: its vectors are recomputed when
needed); the sealed lexical snapshot is rewritten from a purged index (or removed); the recall
counters are rewritten; ``preserved-*`` files (sealed log bytes crash recovery kept aside) are
removed, since they may hold copies of what was forgotten; the query-vector cache is cleared.
What this cannot reach (earlier backups, SSD wear levelling, swap) is in SECURITY.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import NotFound, UsageError
from ..index.bm25 import MAX_CANDIDATES
from ..kinds.fact import KIND, category_of
from ..vault import fsio
from ..vault.format import PRESERVED_PREFIX, fsync_dir
from ..vault.live import LiveVault
from ..vault.records import KINDS, Record, now
from ..vault.store import VaultStore
from .facts import fact_tokens

if TYPE_CHECKING:
    from ..embed.types import Cancellable
    from ..index.caches import VaultIndex
    from ..rag.engine import RagEngine

log = logging.getLogger("memoriesd.memory")

SCOPES = ("specific", "topic")
#: ``store.compact`` keeps this many revisions of every record that is not forgotten: all of them.
KEEP_ALL = 10**9
SNIPPET = 160


@dataclass
class Target:
    """A record chosen to be forgotten, and why."""

    record: Record  # its last revision that is not a deletion
    revisions: int  # revisions the log holds (deletions included)
    match: str  # id, all, lexical, vector, history
    score: float | None = None
    deleted: bool = False  # deleted earlier (`memory delete`), its revisions still in the log

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        text = " ".join(r.body.split()) if r.kind not in ("file", "credential") else ""
        return {
            "id": r.id,
            "kind": r.kind,
            "category": category_of(r) if r.kind == KIND else None,
            "title": r.title,
            "text": text[: SNIPPET - 1] + "…" if len(text) > SNIPPET else text,
            "revisions": self.revisions,
            "deleted": self.deleted,
            "match": self.match,
            "score": None if self.score is None else round(self.score, 6),
        }


def _target(store: VaultStore, record_id: str, match: str, score: float | None = None) -> Target | None:
    revs = store.revisions(record_id)
    if not revs:
        return None
    shown = next((r for r in reversed(revs) if not r.deleted), revs[-1])
    return Target(shown, len(revs), match, score, revs[-1].deleted)


def select_ids(store: VaultStore, ids: list[str]) -> list[Target]:
    """The named records; ``not_found`` for an id the vault does not hold (not even deleted)."""
    out: list[Target] = []
    with store.exclusive():  # one state for every id
        for rid in dict.fromkeys(ids):
            t = _target(store, rid, "id")
            if t is None:
                raise NotFound(f"no record {rid} in vault {store.name}: see `memories memory list`")
            out.append(t)
    return out


def select_all(store: VaultStore, kind: str | None) -> list[Target]:
    """Every current record of ``kind`` (default: every fact)."""
    kind = kind or KIND
    if kind not in KINDS:
        raise UsageError(f"--kind takes {', '.join(KINDS)}")
    with store.exclusive():  # one state for every record
        ids = [r.id for r in store.latest() if r.kind == kind]
        return [t for rid in ids if (t := _target(store, rid, "all")) is not None]


def _history_matches(store: VaultStore, query: str) -> list[str]:
    """Searchable records one of whose earlier revisions holds every word of ``query``."""
    want = fact_tokens(query)
    if not want:
        return []
    out = []
    for rid, revs in store.histories().items():
        if not revs[-1].searchable:
            continue
        for r in revs[:-1]:
            if not r.deleted and want <= fact_tokens(" ".join([r.title, r.body, *r.tags])):
                out.append(rid)
                break
    return out


def _by_meaning(engine: RagEngine, store: VaultStore, idx: VaultIndex, query: str, ctx: Cancellable,
                notices: list[str]) -> dict[str, float]:
    """Each record's best cosine to ``query`` at or above the model's ``forget_min_cosine`` (none for a
    service: its similarities are not calibrated). Missing vectors are embedded on demand as a search
    does (:meth:`memoriesd.rag.vector_view.VectorView.ensure`); the rest are matched by words only."""
    from ..rag.vector_view import open_view

    embedder = engine.embedding.embedder()
    floor = embedder.profile.forget_min_cosine if embedder.profile is not None else None
    if floor is None:
        notices.append("the embedding service's similarities are not calibrated for forgetting: only words were matched")
        return {}
    view = open_view(engine, store, idx, embedder)
    coverage = view.ensure(ctx, limit=engine.config.search.on_demand_embed_limit)
    if (notice := coverage.notice(words_only=True)) is not None:
        notices.append(notice)
    vector: dict[str, float] = {}
    for fid, score in view.search(view.query_vector(query, ctx), max(1, idx.n_fragments()), min_score=floor):
        got = idx.get_fragment(fid)
        if got is not None:
            rid = got[0].record_id
            vector[rid] = max(vector.get(rid, score), score)
    return vector


def select_query(engine: RagEngine, vault: LiveVault, query: str, scope: str, ctx: Cancellable) -> tuple[list[Target], list[str]]:
    """Records on the topic of ``query`` (module docstring), best first; for ``specific`` the best one."""
    store = vault.store
    from ..rag.search import SearchRequest, _default_mode, run_search

    if scope not in SCOPES:
        raise UsageError("--scope takes specific or topic")
    if not query.strip():
        raise UsageError("--query needs words to look for")
    notices: list[str] = []
    idx = engine.vault_index(vault)
    assert idx.bm25 is not None
    lexical: dict[str, float] = {}
    for h in idx.bm25.candidates(query, match_mode="all", limit=MAX_CANDIDATES).hits:
        got = idx.get_fragment(h.frag_id)
        if got is not None:
            rid = got[0].record_id
            lexical[rid] = max(lexical.get(rid, h.score), h.score)
    vector: dict[str, float] = {}
    if _default_mode(engine, store) == "hybrid":
        vector = _by_meaning(engine, store, idx, query, ctx, notices)
    history = [rid for rid in _history_matches(store, query) if rid not in lexical and rid not in vector]
    ordered = sorted(vector, key=lambda r: (-vector[r], r))
    ordered += sorted((r for r in lexical if r not in vector), key=lambda r: (-lexical[r], r))
    ordered += history
    current = store.current(ordered)
    searchable = [rid for rid in ordered if rid in current and current[rid].searchable]
    if scope == "specific" and searchable:
        on_topic = set(searchable)
        best = next(iter(searchable))
        out = run_search(engine, vault, SearchRequest(query=query, limit=100), ctx)
        for c in out.hits:
            got = out.fragment(c.frag_id)
            if got is not None and got[0].record_id in on_topic:
                best = got[0].record_id
                break
        searchable = [best]
    targets: list[Target] = []
    with store.exclusive():  # one state for every target
        for rid in searchable:
            how, score = ("vector", vector[rid]) if rid in vector else ("lexical", lexical[rid]) if rid in lexical else ("history", None)
            t = _target(store, rid, how, score)
            if t is not None:
                targets.append(t)
    return targets, notices


# ---------------------------------------------------------------------------- purge


def _remove_unknown_sidecars(store: VaultStore) -> tuple[int, str | None]:
    """Remove vector sidecars the vault's space list does not name (they cannot be opened to
    filter): (files removed, a notice for the user or None). A space list that cannot be read or
    opened names nothing: then every sidecar is kept (never deleted for it) and the notice says so."""
    from ..index.vectors.maintenance import _spaces_lock
    from ..index.vectors.names import SpacesDamaged, list_sidecars, read_spaces, sidecar_opaque_id
    from ..vault import crypto

    removed = 0
    sealer = store.keys.sealer(crypto.LABEL_VECTORS)
    try:
        with _spaces_lock:
            try:
                spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open, strict=True)
            except SpacesDamaged as exc:
                unknown = len(list_sidecars(store.dir))
                log.warning("vault %s: the vector space list is damaged (%s); forget kept every vector file (%d)",
                            store.vault_id, exc, unknown)
                return 0, (
                    f"the vector space list is damaged, so {unknown} sealed vector file(s) were kept, not filtered: "
                    "they may still hold sealed vectors of what was forgotten; removing the vault's vectors-*.bin "
                    "files removes them (their vectors are computed again when needed)"
                ) if unknown else None
            for path in list_sidecars(store.dir):
                if sidecar_opaque_id(path) not in spaces:
                    fsio.unlink(path, missing_ok=True)
                    removed += 1
    finally:
        sealer.wipe()
    if removed:
        fsync_dir(store.dir)
    return removed, None


def _remove_preserved(store: VaultStore) -> int:
    removed = 0
    for p in sorted(store.dir.glob(f"{PRESERVED_PREFIX}*")):
        if p.is_file():
            fsio.unlink(p, missing_ok=True)
            removed += 1
    if removed:
        fsync_dir(store.dir)
        log.warning("vault %s: forget removed %d preserved crash-recovery file(s)", store.vault_id, removed)
    return removed


def _stamps(store: VaultStore) -> dict[str, tuple[int, int]]:
    """Size and modification time of each vector sidecar (to notice an append)."""
    from ..index.vectors.names import list_sidecars

    out = {}
    for path in list_sidecars(store.dir):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out[path.name] = (st.st_size, st.st_mtime_ns)
    return out


def purge(
    app: object, vault: LiveVault, record_ids: list[str], check: Callable[[], None] | None = None,
    notices: list[str] | None = None,
) -> dict[str, Any]:
    """Forget ``record_ids`` and rewrite every vault file that held them (module docstring).

    ``check`` runs under the store lock right before the deletions are committed (a grant's
    validity): when it raises, nothing is forgotten. What the user must know (vector files kept
    because the space list is damaged) is appended to ``notices``.
    """
    store = vault.store
    from ..index.caches import compact_lexical
    from ..index.vectors.maintenance import compact_vectors
    from .recalls import recalls_of

    engine = getattr(app, "rag", None)
    with store.exclusive():
        if check is not None:
            check()
        tombs: list[Record] = []
        revisions = 0
        forgotten = 0
        for rid in dict.fromkeys(record_ids):
            revs = store.revisions(rid)
            if not revs:
                continue
            forgotten += 1
            revisions += sum(1 for r in revs if not r.deleted)
            last = revs[-1]
            if not last.deleted:
                tombs.append(Record(rid, last.revision + 1, last.kind, "", "", last.private, (), created=last.created, updated=now(), deleted=True))
        if tombs:
            store.commit(tombs)
        compacted = store.compact(KEEP_ALL)  # a new log epoch without them; the old log is removed
    out: dict[str, Any] = {
        "forgotten": forgotten,
        "revisions_removed": revisions,
        "log_epoch": store.head.epoch,
        "log_bytes": compacted["log_bytes"],
    }
    idx = engine.peek_index(store) if engine is not None else None
    out.update(compact_vectors(store, idx))
    out["vector_files_removed"], kept = _remove_unknown_sidecars(store)
    if kept is not None and notices is not None:
        notices.append(kept)
    sidecars = _stamps(store)
    out.update(compact_lexical(store, idx))
    if _stamps(store) != sidecars:
        # An embedding batch that passed its last check before the deletions were committed may
        # have appended its vectors after the rewrite: filter once more (only then).
        again = compact_vectors(store, idx)
        out["vector_entries_dropped"] = out.get("vector_entries_dropped", 0) + again["vector_entries_dropped"]
        out["vector_entries_kept"] = again["vector_entries_kept"]
    recalls_of(vault).drop(record_ids)
    out["preserved_files_removed"] = _remove_preserved(store)
    if engine is not None:
        engine.embedding.query_cache.clear()
    log.info("vault %s: forgot %d record(s), %d revision(s); vault files rewritten", store.vault_id, forgotten, revisions)
    return out


__all__ = ["SCOPES", "Target", "purge", "select_all", "select_ids", "select_query"]
