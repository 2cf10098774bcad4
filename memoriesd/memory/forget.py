"""Forgetting for real: a record goes with every revision and everything derived from it.

What is chosen (:func:`select_ids`, :func:`select_all`, :func:`select_query`):

- ``--id ID...``: those records (any kind, deleted ones too: their revisions are still in the log);
- ``--query Q --scope topic``: every searchable record on the topic, that is one whose current
  text has every term of the query (BM25, ``all`` mode, stemmed), or whose best fragment has a
  cosine to the query of at least the model's ``forget_min_cosine`` (calibrated per model:
  docs/memory.md, "Forget"), or one of whose earlier revisions has every word of the query;
  facts and conversations first;
- ``--query Q --scope specific``: the best of those: the current fact ``Q`` restates (the same
  text, or the same fact as ``memory remember`` judges it) when there is one, else the first of
  the hybrid search's ranking that is on the topic, facts and conversations before notes and cards
  (else the closest by cosine, then by BM25, then by history);
- either way a query chooses only among :data:`QUERY_KINDS` (facts and conversations) unless
  ``--kind`` names the kinds: a note or an ingested card on the topic is *passed over* (listed in
  the reply, kept), never forgotten because a query mentioned its subject;
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
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import CapExceeded, MemoriesError, ModelUnavailable, NotFound, UsageError
from ..index.bm25 import MAX_CANDIDATES
from ..kinds.fact import KIND, category_of
from ..vault import fsio
from ..vault.format import PRESERVED_PREFIX, fsync_dir
from ..vault.live import LiveVault
from ..vault.records import KINDS, Record, now
from ..vault.store import Setting, VaultStore
from ..vault.versions import FORGOT_PREFIX
from .facts import LEXICAL_SAME, _similar_by_model, current_facts, fact_tokens, jaccard, normalise

if TYPE_CHECKING:
    from ..embed.types import Cancellable
    from ..index.caches import VaultIndex
    from ..rag.engine import RagEngine

log = logging.getLogger("memoriesd.memory")


class RagHost(Protocol):
    """What :func:`purge` uses of the daemon's app: its search engine, whose caches it drops."""

    @property
    def rag(self) -> RagEngine | None: ...

SCOPES = ("specific", "topic")
#: The kinds ``--query`` chooses from unless ``--kind`` names others: what was remembered (facts) or
#: said (conversations). A note or an ingested card is never chosen by a query alone: "forget that I
#: prefer zsh" must not take the user's notes about zsh (issue 29).
QUERY_KINDS = ("fact", "conversation")
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


@dataclass
class QueryChoice:
    """What ``--query`` chose, what the user must know, and the records on the topic that were passed over
    because of their kind (kept: a note or a card needs ``--kind`` or ``--id``)."""

    targets: list[Target]
    notices: list[str]
    passed_over: list[Target]


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


def select_all(store: VaultStore, kinds: tuple[str, ...] | None) -> list[Target]:
    """Every current record of ``kinds`` (default: every fact)."""
    wanted = kinds or (KIND,)
    if any(k not in KINDS for k in wanted):
        raise UsageError(f"--kind takes {', '.join(KINDS)}")
    with store.exclusive():  # one state for every record
        ids = [r.id for r in store.latest() if r.kind in wanted]
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


def _same_fact(engine: RagEngine | None, vault: LiveVault, query: str, ctx: Cancellable) -> tuple[str, str, float] | None:
    """The current fact ``query`` restates, as :func:`memoriesd.memory.facts.find_same` would judge a new
    fact (any category): (id, ``exact`` or ``same``, score), or None. Exact: the same normalised text;
    same: the model's ``fact_same_cosine`` (``fact_revise_cosine`` with a revision cue), or without a
    calibrated local model token-set Jaccard >= ``LEXICAL_SAME``."""
    facts = [f for f in current_facts(vault.store) if f.searchable]
    if not facts:
        return None
    norm = normalise(query)
    for rec in facts:
        if normalise(rec.body) == norm:
            return rec.id, "exact", 1.0
    try:
        judged = _similar_by_model(engine, vault, facts, query, ctx)
    except (ModelUnavailable, CapExceeded):
        judged = None
    except MemoriesError as exc:
        if exc.code in ("vault_locked", "cancelled"):
            raise
        judged = None
    if judged is not None:
        rec, score, same = judged
        return (rec.id, "same", score) if same else None
    j, best = max(((jaccard(query, f.body), f) for f in facts), key=lambda p: (p[0], p[1].id))
    return (best.id, "same", j) if j >= LEXICAL_SAME else None


def _best_ranked(engine: RagEngine, vault: LiveVault, query: str, on_topic: list[str], kinds: tuple[str, ...],
                 ctx: Cancellable) -> str | None:
    """The first of the hybrid search's ranking (records of ``kinds`` only) that is on the topic."""
    from ..rag.filters import RecordFilter
    from ..rag.search import SearchRequest, run_search

    allowed = set(on_topic)
    out = run_search(engine, vault, SearchRequest(query=query, limit=100, filters=RecordFilter(kinds=kinds)), ctx)
    for c in out.hits:
        got = out.fragment(c.frag_id)
        if got is not None and got[0].record_id in allowed:
            return got[0].record_id
    return None


def select_query(
    engine: RagEngine, vault: LiveVault, query: str, scope: str, ctx: Cancellable, kinds: tuple[str, ...] | None = None,
) -> QueryChoice:
    """Records on the topic of ``query`` of ``kinds`` (default :data:`QUERY_KINDS`), best first; for
    ``specific`` the best one (module docstring). Those on the topic of other kinds are passed over."""
    store = vault.store
    from ..rag.search import _default_mode

    if scope not in SCOPES:
        raise UsageError("--scope takes specific or topic")
    if not query.strip():
        raise UsageError("--query needs words to look for")
    wanted = kinds or QUERY_KINDS
    if any(k not in KINDS for k in wanted):
        raise UsageError(f"--kind takes {', '.join(KINDS)}")
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
    chosen = [rid for rid in searchable if current[rid].kind in wanted]
    passed = [rid for rid in searchable if current[rid].kind not in wanted]
    # Facts and conversations (what was remembered or said) before notes and cards: a stable sort.
    chosen.sort(key=lambda rid: tier(current[rid].kind))
    same = _same_fact(engine, vault, query, ctx) if KIND in wanted else None
    how: dict[str, tuple[str, float | None]] = {}
    if same is not None:
        how[same[0]] = (same[1], same[2])
        chosen = [same[0], *(rid for rid in chosen if rid != same[0])]
    if scope == "specific" and chosen:
        if same is None:
            first_tier = [k for k in wanted if tier(k) == tier(current[chosen[0]].kind)]
            on_tier = [rid for rid in chosen if current[rid].kind in first_tier]
            chosen = [_best_ranked(engine, vault, query, on_tier, tuple(first_tier), ctx) or on_tier[0]]
        else:
            chosen = chosen[:1]

    def target(rid: str) -> Target | None:
        if rid in how:
            m, score = how[rid]
        elif rid in vector:
            m, score = "vector", vector[rid]
        elif rid in lexical:
            m, score = "lexical", lexical[rid]
        else:
            m, score = "history", None
        return _target(store, rid, m, score)

    with store.exclusive():  # one state for every target
        targets = [t for rid in chosen if (t := target(rid)) is not None]
        others = [t for rid in passed if (t := target(rid)) is not None]
    return QueryChoice(targets, notices, others)


def tier(kind: str) -> int:
    """Rank of a kind when a query chooses: facts and conversations (0) before notes and cards (1)."""
    return 0 if kind in QUERY_KINDS else 1


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
    app: RagHost, vault: LiveVault, record_ids: list[str], check: Callable[[], None] | None = None,
    notices: list[str] | None = None, stamps: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Forget ``record_ids`` and rewrite every vault file that held them (module docstring).

    ``check`` runs under the store lock right before the deletions are committed (a grant's
    validity): when it raises, nothing is forgotten. What the user must know (vector files kept
    because the space list is damaged) is appended to ``notices``. In a synced vault each forget
    is also kept as a ``sync.forgot.<id>`` setting (see :data:`FORGOT_PREFIX`) under a new stamp,
    or the one in ``stamps`` (a forget received from another device).
    """
    store = vault.store
    from ..index.caches import compact_lexical
    from ..index.vectors.maintenance import compact_vectors
    from .recalls import recalls_of

    engine = app.rag
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
        marks: list[Setting] = []
        if store.stamper is not None or stamps:
            for rid in dict.fromkeys(record_ids):
                stamp = (stamps or {}).get(rid) or (store.stamper.next() if store.stamper is not None else "")
                if stamp and FORGOT_PREFIX + rid not in store.settings:
                    marks.append(Setting(FORGOT_PREFIX + rid, stamp))
        if tombs or marks:
            store.commit([*tombs, *marks])
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


__all__ = ["FORGOT_PREFIX", "QUERY_KINDS", "SCOPES", "QueryChoice", "Target", "purge", "select_all", "select_ids", "select_query", "tier"]
