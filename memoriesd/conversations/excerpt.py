"""Context-pack excerpts of conversation fragments: the turns that answer, not the whole group.

A conversation fragment groups up to a dozen turns (:mod:`.fragments`), about 250 tokens: a
1,000-token context pack would hold four of them. The answer to a question is usually one turn and
its neighbours, so the pack shows, of each conversation fragment, the window of
:data:`EXCERPT_TURNS` turns around the turn that matches the query best, and so holds several times
more distinct hits in the same budget.

"Best" is BM25 over the turns of all conversation fragments being packed (the vault's own FTS5
tokenizer, jieba segmentation and stemming, in a throw-away in-memory index), so "what" or "did"
count for little and "pottery" for much. A fragment where no turn matches the query (a hit of the
vector side only) stays whole: nothing says which of its turns matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import QueryInvalid
from ..index.bm25 import MAX_CANDIDATES, BM25Index
from ..index.docs import IndexedDoc
from ..text.fragments import Fragment
from ..vault.records import Record
from .fragments import TurnSpan, turn_spans

#: Turns an excerpt keeps: the best-matching turn with the one before (often the question) and the
#: one after (often the answer). Measured with scripts/eval_conversations.py (README, Conversations).
EXCERPT_TURNS = 3


@dataclass(frozen=True)
class Excerpt:
    """A byte range of a record body made of whole turns, with the turns' indexes."""

    start: int
    end: int
    turns: tuple[int, ...]
    best: tuple[int, int]  # the byte range of the best-matching turn alone (the shortest form)


def excerpts(query: str, hits: Sequence[tuple[Record, int, int]]) -> list[Excerpt | None]:
    """For each ``(record, start, end)`` fragment of a conversation, the excerpt the pack shows,
    or None to show only the whole fragment (not turn-aligned, a single turn, or no turn matches).
    The excerpt of a fragment of at most :data:`EXCERPT_TURNS` turns is the whole fragment; its
    best turn alone is still shorter."""
    windows: list[list[TurnSpan] | None] = []
    docs: list[IndexedDoc] = []
    first: list[int] = []  # index in docs of each window's first turn
    for n, (rec, start, end) in enumerate(hits):
        spans = [t for t in (turn_spans(rec) or []) if t.start < end and start < t.end]
        inside = bool(spans) and spans[0].start >= start and spans[-1].end <= end
        if not inside or len(spans) < 2:
            windows.append(None)
            first.append(len(docs))
            continue
        data = rec.body.encode("utf-8")
        windows.append(spans)
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
        except QueryInvalid:  # no lexical term in the query: every fragment stays whole
            pass
        finally:
            index.close()
    out: list[Excerpt | None] = []
    for window, base in zip(windows, first, strict=True):
        if window is None:
            out.append(None)
            continue
        own = scores[base : base + len(window)]
        best = max(range(len(own)), key=lambda i: (own[i], -i))
        if own[best] <= 0:
            out.append(None)
            continue
        lo = max(0, min(best - EXCERPT_TURNS // 2, len(window) - EXCERPT_TURNS))
        chosen = window[lo : lo + EXCERPT_TURNS]
        top = window[best]
        out.append(Excerpt(chosen[0].start, chosen[-1].end, tuple(t.index for t in chosen), (top.start, top.end)))
    return out


__all__ = ["EXCERPT_TURNS", "Excerpt", "excerpts"]
