"""Facts: short records of kind ``fact`` that are revised instead of piling up.

A fact is a record of kind ``fact`` (3 to 500 characters, no title) whose safe metadata holds its
``category`` (profile, preference, decision, pattern, fact) and, when given, its normalised
``key`` (``preference:typescript``); its importance (0..1) is private metadata (never indexed).

:func:`remember` decides whether a new fact is a new record or a revision of a current fact of
the same category, in this order:

1. the same normalised text (case, spacing and a final full stop aside): an *exact repeat*;
   nothing is written unless new tags or another importance come with it;
2. the same key: a revision of that fact;
3. with a local embedding model whose profile is calibrated (``fact_same_cosine``,
   ``fact_revise_cosine`` of :class:`~memoriesd.embed.profile.ModelProfile`): the most similar
   current fact of the category (cosine of the two texts embedded as fragments are) is the same
   fact at ``fact_same_cosine``, or at the lower ``fact_revise_cosine`` when the new text says it
   replaces something ("actually", "now", "switched to"...);
4. without one (none installed, a remote embedding service, whose cosines are not calibrated here,
   a model that fails on the text): token-set Jaccard >= :data:`LEXICAL_SAME`.

A fact with a key is never merged by similarity into a fact with another key. Earlier revisions
stay in the vault's history (``memory history``) until the fact is forgotten.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Cancelled, CapExceeded, MemoriesError, ModelUnavailable, UsageError
from ..kinds.fact import CATEGORIES, KIND, category_of
from ..vault.live import LiveVault
from ..vault.records import Record, new_record_id, now
from ..vault.store import VaultStore

if TYPE_CHECKING:
    from ..embed.types import Cancellable
    from ..rag.engine import RagEngine

log = logging.getLogger("memoriesd.memory")

#: Categories of the profile block of a context pack, in this order.
PROFILE_CATEGORIES = ("profile", "preference")
MIN_CHARS = 3
MAX_CHARS = 500
DEFAULT_IMPORTANCE = 0.5
MAX_KEY = 200
#: Attempts when the vault changes while the stored facts are embedded (a concurrent write).
_ATTEMPTS = 3


# ---------------------------------------------------------------------------- sameness rules
# Pure functions (no numpy, no model); the thresholds they are compared with are calibrated by
# bench/calibrate_facts.py (docs/memory.md, "Facts").

#: Token-set Jaccard at or above which two facts of one category are the same fact when no
#: embedding model is available. Calibrated with bench/calibrate_facts.py: on its 26 same /
#: 47 different pairs, 0.45 merges no different pair (the highest is 0.40) and catches the
#: paraphrases that share most words (3 of 26); revisions that change the value ("tabs" -> "spaces")
#: share few words and need the model, or a --key.
LEXICAL_SAME = 0.45

# Words that every fact shares ("the user prefers ...") say nothing about which fact it is.
_STOP = frozenset(
    """
    a an the and or but of to in on at by for with from as is are was were be been being it its this that these
    those there here i me my mine we our us you your he she they them their his her user users user's now
    actually really also still just very not no do does did has have had will would should can could
    """.split()
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_HAN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.!。！]+$")
_KEY_SEPARATORS = re.compile(r"[^\w.+#]+|_+")  # runs of anything but letters, digits, . + # (c++, c#, node.js)
_ALNUM = re.compile(r"[^\W_]")
# Words that say a fact replaces what was true before ("actually", "now", "switched to", "no
# longer"...). With one of them, a lower cosine suffices (the profile's fact_revise_cosine): a
# revision changes the value, so it reads less like the old fact than a paraphrase does.
_CUE_WORDS = re.compile(
    r"\b(?:actually|now|nowadays|switched|switches|switch|changed|changes|moved|moves|no\s+longer|any\s*more|"
    r"instead|upgraded|downgraded|replaced|became|becomes|updated|from\s+now\s+on|these\s+days)\b",
    re.IGNORECASE,
)
_CUE_HAN = re.compile(r"现在|如今|改为|改成|换成|换了|搬到|搬去|不再|变成|改用")


def normalise(text: str) -> str:
    """Unicode NFKC, case-folded, whitespace collapsed, trailing full stops dropped: two facts
    with the same normalised text are an exact repeat."""
    flat = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()
    return _TRAILING.sub("", flat)


def normalise_key(category: str, key: str) -> str:
    """``category:key`` with the key case-folded, NFKC, other runs than letters, digits, ``.+#`` as ``-``
    ("" when no letter or digit is left).

    ``--key TypeScript`` and ``--key "preference:typescript"`` in category preference are both
    ``preference:typescript``; a key naming another category keeps that prefix out (the category
    given wins).
    """
    k = unicodedata.normalize("NFKC", key).strip().casefold()
    prefix = category + ":"
    if k.startswith(prefix):
        k = k[len(prefix) :]
    k = _KEY_SEPARATORS.sub("-", k.strip()).strip("-.")
    return f"{category}:{k}" if _ALNUM.search(k) else ""


def revision_cue(text: str) -> bool:
    """Whether ``text`` says it replaces an earlier value ("actually", "now", "switched"...)."""
    flat = unicodedata.normalize("NFKC", text)
    return bool(_CUE_WORDS.search(flat) or _CUE_HAN.search(flat))


def fact_tokens(text: str) -> set[str]:
    """Content tokens of a fact: words (case-folded, NFKC) without stop words; CJK text one token
    per character (no segmenter needed, and two wordings of one Chinese fact share characters)."""
    flat = unicodedata.normalize("NFKC", text).casefold()
    out: set[str] = set()
    for word in _WORD.findall(flat):
        if _HAN.search(word):
            out.update(ch for ch in word if _HAN.match(ch))
            rest = _HAN.sub(" ", word).split()
            out.update(w for w in rest if w not in _STOP)
        elif word not in _STOP:
            out.add(word)
    return out


def jaccard(a: str, b: str) -> float:
    """Token-set Jaccard of two facts' :func:`fact_tokens` (0 when either has none)."""
    ta, tb = fact_tokens(a), fact_tokens(b)
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / len(ta | tb)


@dataclass
class RememberRequest:
    text: str
    category: str = "fact"
    key: str | None = None
    importance: float | None = None
    tags: tuple[str, ...] = ()
    skip_private: bool = False  # a grant's fact: private facts are neither matched nor revised
    source: dict[str, Any] | None = None  # where it was extracted from: meta["from"] (memory.extract)


@dataclass
class Match:
    record: Record
    how: str  # "exact", "key", "cosine" or "lexical"
    score: float | None = None


@dataclass
class Outcome:
    action: str  # added | updated | unchanged
    record: Record
    previous: Record | None = None
    match: Match | None = None
    notices: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        prev = None
        if self.previous is not None and self.action != "unchanged":
            prev = {"revision": self.previous.revision, "text": self.previous.body}
        out: dict[str, Any] = {
            "action": self.action,
            "id": self.record.id,
            "revision": self.record.revision,
            "previous": prev,
            "category": category_of(self.record),
            "key": self.record.meta.get("key") or None,
        }
        if self.match is not None and self.action == "updated":
            out["matched_by"] = self.match.how
            if self.match.score is not None:
                out["similarity"] = round(self.match.score, 4)
        if self.notices:
            out["notices"] = self.notices
        return out


def check_text(text: str) -> str:
    """The fact's text, stripped; ``usage`` when it is not 3 to 500 characters."""
    body = text.strip()
    if len(body) < MIN_CHARS:
        raise UsageError(f"a fact needs at least {MIN_CHARS} characters: say what to remember")
    if len(body) > MAX_CHARS:
        raise UsageError(
            f"a fact is at most {MAX_CHARS} characters (this one has {len(body):,}): keep longer text as a note "
            "with `memories memory add`"
        )
    return body


def check_importance(value: float | None) -> float | None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise UsageError("--importance is a number from 0 to 1")
    return value


def importance_of(rec: Record) -> float:
    value = rec.private_meta.get("importance")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_IMPORTANCE


def current_facts(store: VaultStore, category: str | None = None) -> list[Record]:
    """Current (latest, not deleted) facts, optionally of one category."""
    return [r for r in store.latest() if r.kind == KIND and (category is None or category_of(r) == category)]


def fact_view(rec: Record, recalls: tuple[int, float | None] = (0, None)) -> dict[str, Any]:
    """A fact as ``memory list --kind fact`` shows it."""
    return {
        "id": rec.id,
        "revision": rec.revision,
        "category": category_of(rec),
        "key": rec.meta.get("key") or None,
        "text": rec.body,
        "importance": importance_of(rec),
        "tags": list(rec.tags),
        "private": rec.private,
        "recalls": recalls[0],
        "last_recall": recalls[1],
        "created": rec.created,
        "updated": rec.updated,
    }


def profile_order(facts: list[Record]) -> list[Record]:
    """Profile facts first, then preferences; each by importance, then the most recently updated."""
    rank = {c: i for i, c in enumerate(PROFILE_CATEGORIES)}
    return sorted(
        (f for f in facts if category_of(f) in rank and not f.private),
        key=lambda f: (rank[category_of(f)], -importance_of(f), -f.updated, f.id),
    )


# ---------------------------------------------------------------------------- matching


def _similar_by_model(engine: RagEngine | None, vault: LiveVault, facts: list[Record], text: str,
                      ctx: Cancellable) -> tuple[Record, float, bool] | None:
    """The most similar fact by cosine, and whether it passes the model's threshold; None when no
    calibrated local model can judge (the caller falls back to the lexical rule). Every fact's
    vector is ensured first (all of them: a comparison needs each one), on the vector recipe."""
    from ..rag.vector_view import open_view

    store = vault.store

    if engine is None or not facts or engine.embedding.choice().source != "local":
        return None  # none, or a remote service: its cosines are not calibrated here
    embedder = engine.embedding.embedder()
    profile = embedder.profile
    if profile is None:
        return None
    for attempt in range(_ATTEMPTS):
        try:
            idx = engine.vault_index(vault)
            view = open_view(engine, store, idx, embedder)
            if idx.bm25 is None:
                return None
            owner: dict[int, Record] = {}
            for rec in facts:
                if rec.searchable:
                    for fid in idx.bm25.frag_ids(rec.id):
                        owner[fid] = rec
            if not owner:
                return None
            view.ensure(ctx, limit=None, among=list(owner))
            pairs = view.search(view.document_vector(None, text, ctx), len(owner), allowed=set(owner))
            break
        except Cancelled:
            if store.closed or attempt == _ATTEMPTS - 1:
                raise
    if not pairs:
        return None
    fid, score = pairs[0]
    threshold = profile.fact_revise_cosine if revision_cue(text) else profile.fact_same_cosine
    return owner[fid], float(score), score >= threshold


def find_same(engine: RagEngine | None, vault: LiveVault, req: RememberRequest, key: str, ctx: Cancellable, notices: list[str]) -> Match | None:
    """The current fact of the category that ``req`` restates or revises, if any (module docstring)."""
    store = vault.store
    facts = [f for f in current_facts(store, req.category) if not (req.skip_private and f.private)]
    norm = normalise(req.text)
    for rec in facts:
        if normalise(rec.body) == norm and (not key or rec.meta.get("key") in (None, "", key)):
            return Match(rec, "exact", 1.0)
    if key:
        for rec in facts:
            if rec.meta.get("key") == key:
                return Match(rec, "key")
    # Similarity only among facts a keyed fact could be: same key or none.
    pool = [r for r in facts if not key or not r.meta.get("key")]
    if not pool:
        return None
    try:
        judged = _similar_by_model(engine, vault, pool, req.text, ctx)
    except (ModelUnavailable, CapExceeded) as exc:
        notices.append(f"compared by words, not by meaning ({exc.message})")
        judged = None
    except MemoriesError as exc:
        if exc.code in ("vault_locked", "cancelled"):
            raise
        log.warning("vault %s: a fact could not be compared by embedding (%s); words are compared instead", store.vault_id, exc.code)
        judged = None
    if judged is not None:
        rec, score, same = judged
        return Match(rec, "cosine", score) if same else None
    best: tuple[float, Record] | None = None
    for rec in pool:
        j = jaccard(req.text, rec.body)
        if best is None or j > best[0]:
            best = (j, rec)
    if best is not None and best[0] >= LEXICAL_SAME:
        return Match(best[1], "lexical", best[0])
    return None


# ---------------------------------------------------------------------------- remember


def remember(engine: RagEngine | None, vault: LiveVault, req: RememberRequest, ctx: Cancellable) -> Outcome:
    """Add a fact, or revise the current fact it restates (see the module docstring).

    The caller holds the vault's ``facts`` mutex, so two remembers of one fact cannot both add it.
    """
    store = vault.store
    if req.category not in CATEGORIES:
        raise UsageError(f"--category takes {', '.join(CATEGORIES)}")
    req.text = check_text(req.text)
    check_importance(req.importance)
    key = ""
    if req.key is not None:
        if len(req.key) > MAX_KEY:
            raise UsageError(f"--key is at most {MAX_KEY} characters")
        key = normalise_key(req.category, req.key)
        if not key:
            raise UsageError("--key needs letters or digits, e.g. --key typescript")
    notices: list[str] = []
    match = find_same(engine, vault, req, key, ctx, notices)
    with store.exclusive():
        # Under the lock that `grant revoke` also takes: a grant revoked or expired by now (or a client
        # gone) writes nothing; one revoked after the commit finds the fact committed.
        ctx.check_cancelled()
        if match is None:
            t = now()
            meta: dict[str, Any] = {"category": req.category}
            if key:
                meta["key"] = key
            if req.source is not None:
                meta["from"] = req.source
            pmeta = {"importance": req.importance if req.importance is not None else DEFAULT_IMPORTANCE}
            rec = Record(new_record_id(), 1, KIND, "", req.text, False, req.tags, meta=meta, private_meta=pmeta, created=t, updated=t)
            store.commit([rec])
            return Outcome("added", rec, None, None, notices)
        old = store.get(match.record.id)  # the current revision, were it revised meanwhile
        tags = tuple(dict.fromkeys([*old.tags, *req.tags]))
        importance = importance_of(old) if req.importance is None else req.importance
        same_text = normalise(old.body) == normalise(req.text)
        if same_text and tags == old.tags and importance == importance_of(old) and (not key or old.meta.get("key") == key):
            return Outcome("unchanged", old, old, match, notices)
        meta = dict(old.meta)
        meta["category"] = req.category
        if key:
            meta["key"] = key
        if req.source is not None:
            meta["from"] = req.source
        new = Record(
            old.id,
            old.revision + 1,
            KIND,
            old.title,
            old.body if same_text else req.text,
            old.private,
            tags,
            meta=meta,
            private_meta={**old.private_meta, "importance": importance},
            created=old.created,
            updated=now(),
        )
        store.commit([new])
        return Outcome("updated", new, old, match, notices)


__all__ = [
    "LEXICAL_SAME",
    "fact_tokens",
    "jaccard",
    "normalise",
    "normalise_key",
    "revision_cue",
    "MAX_CHARS",
    "PROFILE_CATEGORIES",
    "Outcome",
    "RememberRequest",
    "current_facts",
    "fact_view",
    "importance_of",
    "profile_order",
    "remember",
]
