"""The context pack: what an assistant should know for a query, within a token budget.

Two blocks, in this order, each item labelled ``[S1]``, ``[S2]``... and always whole:

1. *About the user*: the current profile facts, then preference facts (each by importance, then
   the most recently updated);
2. *Relevant memories*: the hybrid search's best fragments for the query (facts of any category
   and fragments of notes and cards; with a model, vector neighbours under its evidence floor are
   left out, as for ``rag ask``), best first, without what the first block already holds. As for
   ``rag ask``, a conversation fragment's vector score is lifted by its best turn window
   (:mod:`memoriesd.index.vectors.windows`).

Sizes are counted with the embedding model's tokenizer when a local model is in use (special
tokens excluded; a text longer than the model reads is counted in halves), else estimated: one
token per CJK character (Han, kana, Hangul) and one per 4 other characters, rounded up per run.
Each item costs its line (label included) plus one token for the line break; a block costs its
heading (the relevant block also the blank line before it) once it has an item. ``used_tokens`` is that sum, never above the budget.

Priority rule: when everything does not fit, the least relevant memories are left out first
(relevant items are taken in order of relevance; one that does not fit whole is left out and the
next, smaller, one may still fit; a conversation fragment may come as an excerpt of the turns
that answer, :mod:`memoriesd.memory.excerpt`: when it does not fit whole, or, when its
turn window chose the excerpt, once the items before it fill :data:`WHOLE_SHARE` of the room). The profile block is shortened, from its least important end,
only when it is over :data:`PROFILE_SHARE` of the budget while relevant memories wait
for the room (when they need less, the profile may use the rest). Budget still left at the end
takes further profile items that fit.

Every fact in a pack counts as a recall (:mod:`memoriesd.memory.recalls`).

Filters (``--kind``, ``--category``, ``--tag``, ``--since/--until``, ``--speaker``:
:mod:`memoriesd.rag.filters`) apply to every item of the pack: profile facts that do not pass are
left out, like the search's.

An excerpt of a conversation shows its session date and the speakers of its turns in its line
(``[S3] Title (8 May 2023, 1:56 pm; Caroline, Melanie): ...``) and, in JSON, ``conversation``:
``{date, when, speakers, turns, refs}`` as search results have. Every JSON item carries ``start``
and ``end``: the byte range of its fragment in the record body (null for profile facts, which are
whole records), and ``line``: the 1-based line of that range (of the source file for a card), as search results have.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..kinds.fact import KIND, category_of
from ..kinds.turns import TurnSpan, conversation_view, turn_spans
from ..vault.live import LiveVault
from ..vault.records import Record
from ..vault.store import VaultStore
from .excerpt import excerpts
from .facts import current_facts, profile_order

if TYPE_CHECKING:
    from ..embed.types import Tokenizing
    from ..index.docs import IndexedDoc
    from ..rag.engine import RagEngine
    from ..rag.filters import RecordFilter
    from ..rag.host import Host, Work
    from ..rag.search import SearchOutcome
    from ..text.fragments import Fragment
    from .rewrite import RewriteRequest

CONVERSATION = "conversation"
PROFILE_HEADING = "## About the user"
RELEVANT_HEADING = "## Relevant memories"
#: Share of the relevant block's room that whole conversation fragments may fill before the next
#: ones come as excerpts chosen by their turn window (bench/eval_conversations.py; docs/memory.md, "Context pack").
WHOLE_SHARE = 0.5
MIN_BUDGET = 32
MAX_BUDGET = 1_000_000
PROFILE_SHARE = 0.3  # the profile block is shortened only when over this share while memories wait (was [rag] context_profile_share)
CONTEXT_ITEMS = 20  # search results considered for the relevant block (was [rag] context_items)
_CJK = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003ffff]")


def estimate_tokens(text: str) -> int:
    """The documented estimate without a model: 1 per CJK character, 1 per 4 other characters
    (rounded up for each run between CJK characters)."""
    total = 0
    run = 0
    for ch in text:
        if _CJK.match(ch):
            total += 1 + math.ceil(run / 4)
            run = 0
        else:
            run += 1
    return total + math.ceil(run / 4)


class TokenCounter:
    """Counts with a local model's tokenizer (:class:`memoriesd.embed.types.Tokenizing`), else :func:`estimate_tokens`."""

    def __init__(self, tokenizer: Tokenizing | None = None) -> None:
        self._count: Callable[[str], int] | None = tokenizer.count_tokens if tokenizer is not None else None
        self.kind = "model" if self._count is not None else "estimate"
        self._max = int(tokenizer.max_tokens or 0) if tokenizer is not None else 0
        self._base = self._count("") if self._count is not None else 0  # the special tokens every count includes

    def __call__(self, text: str) -> int:
        if self._count is None:
            return estimate_tokens(text)
        return self._model(text)

    def _model(self, text: str) -> int:
        assert self._count is not None
        if not text:
            return 0
        n = self._count(text)
        if n < self._max or len(text) < 2:
            return max(0, n - self._base)
        # Truncated at the model's maximum: count the halves (cut at a space near the middle).
        mid = len(text) // 2
        cut = text.rfind(" ", 0, mid)
        cut = mid if cut <= 0 else cut
        return self._model(text[:cut]) + self._model(text[cut:])


@dataclass
class PackItem:
    record_id: str
    revision: int
    kind: str
    category: str | None
    title: str
    text: str  # the item's text as the pack shows it (whitespace flattened), without its label
    score: float | None
    source: str | None
    block: str  # profile | relevant
    cost: int = 0  # tokens of its line without the label, plus the line break
    start: int | None = None  # the fragment's byte range in the record body (None: the whole record)
    end: int | None = None
    conversation: dict[str, Any] | None = field(default=None)  # a conversation excerpt: date, speakers, turns
    alt: PackItem | None = None  # a shorter excerpt to take when the whole item does not fit
    excerpt_first: bool = False  # past WHOLE_SHARE of the room, start from the excerpt (a window chose it)

    def line(self, label: str) -> str:
        if self.category is not None:
            return f"[{label}] ({self.category}) {self.text}"
        about = _about(self.conversation) if self.conversation is not None else ""
        if about:
            return f"[{label}] {self.title} ({about}): {self.text}" if self.title else f"[{label}] ({about}) {self.text}"
        if self.title:
            return f"[{label}] {self.title}: {self.text}"
        return f"[{label}] {self.text}"

    def body(self) -> str:
        return self.line("")[3:]  # the line without "[] " (its label is counted separately)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _about(conv: dict[str, Any]) -> str:
    """A conversation excerpt's session day for its line ("8 May 2023"); its speakers are already in
    its text (``Name: ...``) and in the JSON item, so the line does not spend tokens on them again."""
    when = conv.get("when")
    if when:
        return str(when).split(",")[0]
    return str(conv.get("date") or "")


Trim = Callable[["PackItem", list["PackItem"]], "PackItem | None"]


def _take(items: list[PackItem], room: int, label_cost: int, trim: Trim | None = None) -> tuple[list[PackItem], int]:
    """Items in order that fit whole into ``room`` tokens (one that does not fit is replaced by its
    shorter excerpt when that fits, else skipped). ``trim`` shows a form without what the items
    already chosen hold (None: nothing new in it, so the item is skipped)."""
    chosen: list[PackItem] = []
    used = 0
    for it in items:
        form: PackItem | None = it
        if it.excerpt_first and it.alt is not None and used >= WHOLE_SHARE * room:
            form = it.alt  # half the room is used: the turns that answer, so that more hits fit
        while form is not None:
            shown = trim(form, chosen) if trim is not None else form
            if shown is None:
                break
            if used + shown.cost + label_cost <= room:
                chosen.append(shown)
                used += shown.cost + label_cost
                break
            form = form.alt
    return chosen, used


def turn_trimmer(records: dict[str, Record], count: Callable[[str], int]) -> Trim:
    """A conversation fragment overlaps its neighbours by a turn, and an excerpt may repeat turns of
    a fragment already in the pack: the pack shows each turn once. A form whose turns are partly in
    the chosen items of the same record is cut to its longest run of turns not yet shown."""

    def trim(form: PackItem, chosen: list[PackItem]) -> PackItem | None:
        rec = records.get(form.record_id)
        if rec is None or form.start is None or form.end is None:
            return form
        shown = [(c.start, c.end) for c in chosen if c.record_id == form.record_id and c.start is not None]
        if not any(s < form.end and form.start < e for s, e in shown if e is not None):
            return form
        runs: list[list[TurnSpan]] = [[]]
        for t in turn_spans(rec) or []:
            if not (form.start <= t.start and t.end <= form.end):
                continue
            if any(s <= t.start and e is not None and t.end <= e for s, e in shown):
                runs.append([])
            else:
                runs[-1].append(t)
        run = max(runs, key=len)
        if not run:
            return None
        start, end = run[0].start, run[-1].end
        text = rec.body.encode("utf-8")[start:end].decode("utf-8")
        cut = replace(form, text=_flat(text), start=start, end=end, alt=None,
                      conversation=conversation_view(rec, start, end))
        cut.cost = count(cut.body()) + 1
        return cut

    return trim


def select(
    profile: list[PackItem],
    relevant: list[PackItem],
    budget: int,
    share: float,
    count: Callable[[str], int],
    trim: Trim | None = None,
) -> tuple[list[PackItem], list[PackItem], int]:
    """The priority rule (module docstring): the items of each block and the tokens used."""
    n = len(profile) + len(relevant)
    label_cost = count(f"[S{max(1, n)}] ")
    head_p = count(PROFILE_HEADING) + 1
    head_r = count(RELEVANT_HEADING) + 2  # its line break and the blank line before it
    want_r = (head_r + sum(it.cost + label_cost for it in relevant)) if relevant else 0
    cap_p = budget if not relevant else max(int(share * budget), budget - want_r)
    chosen_p, used_p = _take(profile, cap_p - head_p, label_cost) if profile and cap_p > head_p else ([], 0)
    cost_p = head_p + used_p if chosen_p else 0
    room_r = budget - cost_p - head_r
    chosen_r, used_r = _take(relevant, room_r, label_cost, trim) if relevant and room_r > 0 else ([], 0)
    cost_r = head_r + used_r if chosen_r else 0
    left = budget - cost_p - cost_r
    taken = set(map(id, chosen_p))
    rest = [it for it in profile if id(it) not in taken]
    if rest and left > 0:
        extra_room = left if chosen_p else left - head_p
        more, used_more = _take(rest, extra_room, label_cost)
        if more:
            taken |= set(map(id, more))
            chosen_p = [it for it in profile if id(it) in taken]  # profile order kept
            cost_p = head_p + used_p + used_more
    return chosen_p, chosen_r, cost_p + cost_r


def _counter(engine: RagEngine | None) -> TokenCounter:
    """The local model's tokenizer when it is the vault's embedder, else the estimate."""
    if engine is None:
        return TokenCounter(None)
    try:
        return TokenCounter(engine.embedding.tokenizer())
    except Exception:  # noqa: BLE001 - a model that cannot load: the estimate
        return TokenCounter(None)


def build_pack(
    app: Host, vault: LiveVault, query: str, budget: int, ctx: Work, flt: RecordFilter | None = None, mode: str | None = None,
    rewrite: RewriteRequest | None = None,
) -> dict[str, Any]:
    """The ``rag.context`` answer: budget, used tokens, the items and the plain text.

    ``flt``: a :class:`~memoriesd.rag.filters.RecordFilter` every item must pass (None: all);
    ``mode``: the search's (bm25, vector, hybrid; None: hybrid when a model is usable, else bm25);
    ``rewrite``: the request's word on query rewriting (:mod:`.rewrite`; None: ``[context] rewrite``)."""
    store = vault.store
    from ..rag.search import SearchRequest
    from .recalls import note_recalls
    from .rewrite import search_pack

    if not query.strip():
        raise UsageError("give the query the context is for")
    if not MIN_BUDGET <= budget <= MAX_BUDGET:
        raise UsageError(f"--budget is a number of tokens from {MIN_BUDGET} to {MAX_BUDGET:,}")
    engine = app.rag
    profile_facts = profile_order([f for f in current_facts(store) if flt is None or flt.keeps(f)])
    profile = [
        PackItem(f.id, f.revision, KIND, category_of(f), "", _flat(f.body), None, None, "profile") for f in profile_facts
    ]
    req = SearchRequest(query=query, mode=mode, limit=CONTEXT_ITEMS, evidence_floor=True, filters=flt, windows=True)
    out, queries = search_pack(app, vault, req, ctx, rewrite)  # [context] rewrite: the question's queries fused (.rewrite)
    found = _found(out, store, {f.id for f in profile_facts})
    relevant = _relevant(" ".join(queries or [query]), out, found)  # excerpts match the queries that found them
    count = _counter(engine)
    for it in profile + relevant:
        form: PackItem | None = it
        while form is not None:
            form.cost = count(form.body()) + 1
            form = form.alt
    trim = turn_trimmer({rec.id: rec for doc, _, _, rec, _ in found if doc.kind == CONVERSATION and rec is not None}, count)
    chosen_p, chosen_r, used = select(profile, relevant, budget, PROFILE_SHARE, count, trim)
    label_cost = count(f"[S{max(1, len(profile) + len(relevant))}] ")
    items, lines = _render(out, chosen_p, chosen_r, label_cost)
    note_recalls(vault, [i["record_id"] for i in items])
    left_out = len(profile) + len(relevant) - len(items)
    return {
        "query": query,
        "budget": budget,
        "used_tokens": used,
        "tokenizer": count.kind,
        "mode": out.mode,
        "items": items,
        "left_out": left_out,
        "text": "\n".join(lines) + ("\n" if lines else ""),
        "notices": list(out.notices),
        **({"queries": queries} if queries is not None else {}),
    }


#: A search hit kept for the pack: (doc, fragment, score, the record of a fact or conversation, fragment id).
Found = tuple["IndexedDoc", "Fragment", float, "Record | None", int]


def _found(out: SearchOutcome, store: VaultStore, in_profile: set[str]) -> list[Found]:
    """The search's hits that may go in the pack: not a profile fact again, not empty, still readable."""
    found: list[Found] = []
    for c in out.hits:
        got = out.fragment(c.frag_id)
        if got is None:
            continue
        doc, frag = got
        if doc.record_id in in_profile or not frag.text.strip():
            continue
        rec = None
        if doc.kind in (KIND, CONVERSATION):
            try:
                # a conversation's turn offsets are those of the indexed revision
                rec = store.get(doc.record_id, doc.revision if doc.kind == CONVERSATION else None)
            except Exception:  # noqa: BLE001 - changed meanwhile: not in this pack
                continue
        found.append((doc, frag, c.rerank_score if c.rerank_score is not None else c.score, rec, c.frag_id))
    return found


def _relevant(query: str, out: SearchOutcome, found: list[Found]) -> list[PackItem]:
    """The relevant block's candidates, in search order, each with its shorter forms."""
    # A conversation fragment that no longer fits whole may still fit as an excerpt of the few turns
    # that match the query best (memory.excerpt): the pack then holds more distinct hits.
    # (a fact's or a conversation's record is always read by _found: `rec is not None` only narrows the type)
    convs = [(rec, frag.start, frag.end) for doc, frag, _, rec, _ in found if doc.kind == CONVERSATION and rec is not None]
    wins = [out.best_windows.get(fid) for doc, _, _, rec, fid in found if doc.kind == CONVERSATION and rec is not None]
    cuts = iter(excerpts(query, convs, wins))
    relevant: list[PackItem] = []
    for doc, frag, score, rec, _ in found:
        category = None
        conversation = None
        if doc.kind == KIND and rec is not None:
            category = category_of(rec)
        elif doc.kind == CONVERSATION and rec is not None:
            conversation = conversation_view(rec, frag.start, frag.end)
        item = PackItem(doc.record_id, doc.revision, doc.kind, category, "" if doc.kind == KIND else _flat(doc.title),
                        _flat(frag.text), round(float(score), 6), doc.source, "relevant",
                        start=frag.start, end=frag.end, conversation=conversation)
        if doc.kind == CONVERSATION and rec is not None and (cut := next(cuts)) is not None:
            # Shorter forms, tried in turn when the whole fragment does not fit: the few turns that
            # match best (by the fragment's closest turn window, else BM25), down to one turn.
            last = item
            for start, end in cut.forms:
                if (start, end) == (last.start, last.end):
                    continue
                text = rec.body.encode("utf-8")[start:end].decode("utf-8")
                last.alt = replace(item, text=_flat(text), start=start, end=end, alt=None,
                                   conversation=conversation_view(rec, start, end))
                last = last.alt
            item.excerpt_first = cut.by_window
        relevant.append(item)
    return relevant


def _render(
    out: SearchOutcome, chosen_p: list[PackItem], chosen_r: list[PackItem], label_cost: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The chosen items labelled S1, S2... across both blocks, and the pack's lines of text."""
    items: list[dict[str, Any]] = []
    lines: list[str] = []
    n = 0
    for heading, block in ((PROFILE_HEADING, chosen_p), (RELEVANT_HEADING, chosen_r)):
        if not block:
            continue
        if lines:
            lines.append("")
        lines.append(heading)
        for it in block:
            n += 1
            label = f"S{n}"
            lines.append(it.line(label))
            items.append(
                {
                    "label": label,
                    "record_id": it.record_id,
                    "revision": it.revision,
                    "kind": it.kind,
                    "category": it.category,
                    "title": it.title,
                    "text": it.text,
                    "tokens": it.cost + label_cost,
                    "score": it.score,
                    "source": it.source,
                    "line": out.line(it, it.start) if it.start is not None else None,  # as search results: source:line
                    "block": it.block,
                    "start": it.start,
                    "end": it.end,
                    "conversation": it.conversation,
                }
            )
    return items, lines


__all__ = ["TokenCounter", "build_pack", "estimate_tokens", "select"]
