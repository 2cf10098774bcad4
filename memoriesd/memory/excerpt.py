"""Context-pack excerpts of conversation fragments: the turns that answer, not the whole group.

A conversation fragment groups up to a dozen turns (:mod:`.fragments`), about 250 tokens: a
1,000-token context pack would hold four of them. The answer to a question is usually one turn and
its neighbours, so the pack may show, of a conversation fragment, only the few turns that answer,
and so holds more distinct hits in the same budget.

Which turns: when the vector search found the fragment's closest turn window (:mod:`.windows`,
``rag context`` with a model), that pair with its neighbours, narrowing to the pair and to one
of its turns. Of the LoCoMo dev fragments that hold evidence in the hybrid top 10, the 4-turn form
held it for 96%, the 3-turn form for 90%, three turns around the best BM25 turn for 80%: enough
that past half the pack, conversation hits come as these excerpts first
(:data:`memoriesd.memory.packs.WHOLE_SHARE`). Else, the :data:`EXCERPT_TURNS` turns around the
turn that BM25 matches best over the turns of all conversation fragments being packed (the vault's
own FTS5 tokenizer, jieba segmentation and stemming, in a throw-away in-memory index; "what" or
"did" count for little and "pottery" for much), then that turn alone, only when the whole fragment
does not fit. A fragment where nothing says which turns matter (no window, no turn matching the
query) stays whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import QueryInvalid
from ..index.bm25 import MAX_CANDIDATES, BM25Index
from ..index.docs import IndexedDoc
from ..kinds.turns import TurnSpan, turn_spans
from ..text.fragments import Fragment
from ..vault.records import Record

#: Turns an excerpt keeps: the best-matching turn with the one before (often the question) and the
#: one after (often the answer). Measured with bench/eval_conversations.py (docs/memory.md, "Conversations").
EXCERPT_TURNS = 3


@dataclass(frozen=True)
class Excerpt:
    """Shorter forms of a conversation fragment: byte ranges of whole turns of its record body,
    longest first (the pack takes the first that fits)."""

    forms: tuple[tuple[int, int], ...]
    by_window: bool = False  # chosen by the fragment's closest turn window (else by BM25)


def _range(turns: Sequence[TurnSpan], lo: int, n: int) -> tuple[int, int]:
    """The byte range of ``n`` consecutive turns from ``lo``, shifted to stay inside ``turns``."""
    lo = max(0, min(lo, len(turns) - n))
    part = turns[lo : lo + n]
    return part[0].start, part[-1].end


def excerpts(
    query: str, hits: Sequence[tuple[Record, int, int]], windows: Sequence[int | None] | None = None
) -> list[Excerpt | None]:
    """For each ``(record, start, end)`` fragment of a conversation, the excerpt forms the pack may
    show, or None to show only the whole fragment (not turn-aligned, a single turn, or nothing says
    which turns matter).

    ``windows`` (aligned with ``hits``): the fragment's closest turn window by vector, if known
    (:mod:`.windows`): the forms are then that pair with the turn before and after, the pair with
    the neighbour BM25 prefers, the pair, and the one of the two BM25 prefers (the second, an
    answer, when neither matches). Else the :data:`EXCERPT_TURNS` turns around the turn BM25
    matches best, then that turn alone."""
    lists: list[list[TurnSpan] | None] = []
    docs: list[IndexedDoc] = []
    first: list[int] = []  # index in docs of each fragment's first turn
    for n, (rec, start, end) in enumerate(hits):
        spans = [t for t in (turn_spans(rec) or []) if t.start < end and start < t.end]
        inside = bool(spans) and spans[0].start >= start and spans[-1].end <= end
        if not inside or len(spans) < 2:
            lists.append(None)
            first.append(len(docs))
            continue
        data = rec.body.encode("utf-8")
        lists.append(spans)
        first.append(len(docs))
        for t in spans:
            text = data[t.start : t.end].decode("utf-8", "replace")
            frag = Fragment(f"{n}.{t.index}", 0, 0, 0, len(text), text, "")
            docs.append(IndexedDoc(f"{n}.{t.index}", 0, "turn", "", "", None, (frag,)))
    scores = [0.0] * len(docs)
    if docs:
        index = BM25Index(docs)
        try:
            for hit in index.candidates(query, limit=min(len(docs), MAX_CANDIDATES)).hits:
                scores[hit.frag_id] = hit.score
        except QueryInvalid:  # no lexical term in the query: only the windows say which turns
            pass
        finally:
            index.close()
    out: list[Excerpt | None] = []
    for n, (turns, base) in enumerate(zip(lists, first, strict=True)):
        if turns is None:
            out.append(None)
            continue
        own = scores[base : base + len(turns)]
        w = windows[n] if windows is not None else None
        if w is not None and 0 <= w < len(turns) - 1:
            before = own[w - 1] if w > 0 else -1.0
            after = own[w + 2] if w + 2 < len(turns) else -1.0
            one = w if own[w] > own[w + 1] else w + 1
            forms = (_range(turns, w - 1, 4), _range(turns, w - 1 if before > after else w, 3),
                     _range(turns, w, 2), _range(turns, one, 1))
            out.append(Excerpt(tuple(dict.fromkeys(forms)), by_window=True))
            continue
        best = max(range(len(own)), key=lambda i: (own[i], -i))
        if own[best] <= 0:
            out.append(None)
            continue
        around = _range(turns, best - EXCERPT_TURNS // 2, EXCERPT_TURNS)
        out.append(Excerpt(tuple(dict.fromkeys((around, _range(turns, best, 1))))))
    return out


__all__ = ["EXCERPT_TURNS", "Excerpt", "excerpts"]
