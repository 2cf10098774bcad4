"""What `rag search` and `memory search` answer: a search's hits as JSON items.

`rag search`'s items are fragments (``--fragments``) or, by default, documents: each its best
fragment's item plus the grouping's fields (:func:`memoriesd.rag.documents.group_fields`);
`memory search`'s are one line per record.
"""

from __future__ import annotations

from typing import Any

from ..index.docs import IndexedDoc
from ..kinds.registry import kind_of
from ..text.fragments import Fragment
from .documents import Span, group_fields
from .search import SearchOutcome

SNIPPET_CHARS = 200


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def kind_view(out: SearchOutcome, doc: IndexedDoc, frag: Fragment) -> dict[str, Any]:
    """What a result shows of its kind beyond the text, under the kind's name (a conversation
    fragment's ``{date, when, speakers, turns, refs}``: :meth:`RecordKind.result_view`); ``{}`` for
    kinds without one, the kind's name with None when the indexed revision is gone meanwhile."""
    kind = kind_of(doc.kind)
    if not kind.has_view:
        return {}
    from ..errors import MemoriesError

    try:
        rec = out.index.store.get(doc.record_id, doc.revision)
    except MemoriesError:
        return {kind.name: None}
    return {kind.name: kind.result_view(rec, frag.start, frag.end)}


def fragment_results(out: SearchOutcome) -> list[dict[str, Any]]:
    """The ``rag search --json`` items: one per fragment, labelled [S1], [S2]... in rank order.
    A conversation's fragment also carries ``conversation`` (:func:`kind_view`)."""
    items = []
    found = [(c, got) for c in out.hits if (got := out.fragment(c.frag_id)) is not None]
    for i, (c, (doc, frag)) in enumerate(found, start=1):
        score = c.rerank_score if c.rerank_score is not None else c.score
        items.append(
            {
                "label": f"S{i}",
                "record_id": doc.record_id,
                "revision": doc.revision,
                "title": doc.title,
                "kind": doc.kind,
                "fingerprint": frag.fingerprint,
                "start": frag.start,
                "end": frag.end,
                "score": round(float(score), 6),
                "relevance": out.relevance(float(score)),
                "fused_score": round(float(c.score), 6) if out.mode == "hybrid" else None,
                "bm25_rank": c.bm25_rank,
                "vector_rank": c.vector_rank,
                "cosine": None if c.cosine is None else round(float(c.cosine), 6),
                "text": frag.text,
                "source": doc.source,
                "line": out.line(doc, frag.start),
                "end_line": out.line(doc, max(frag.start, frag.end - 1)),
            }
            | group_fields(
                None if out.documents is None else out.documents.get(c.frag_id), lambda fid: _span(out, fid)
            )
            | kind_view(out, doc, frag)
        )
    return items


def _span(out: SearchOutcome, frag_id: int) -> Span | None:
    got = out.fragment(frag_id)
    if got is None:
        return None
    doc, frag = got
    return Span(frag.start, frag.end, out.line(doc, frag.start), out.line(doc, max(frag.start, frag.end - 1)))


def document_results(out: SearchOutcome, limit: int) -> list[dict[str, Any]]:
    """`memory search`: one line per record (its best fragment's score and a snippet)."""
    seen: dict[str, dict[str, Any]] = {}
    for c in out.hits:
        got = out.fragment(c.frag_id)
        if got is None:
            continue
        doc, frag = got
        if doc.record_id in seen:
            continue
        score = c.rerank_score if c.rerank_score is not None else c.score
        seen[doc.record_id] = {
            "id": doc.record_id,
            "revision": doc.revision,
            "kind": doc.kind,
            "title": doc.title,
            "score": round(float(score), 6),
            "relevance": out.relevance(float(score)),
            "snippet": snippet(frag.text),
            "source": doc.source,
            "line": out.line(doc, frag.start),
            "end_line": out.line(doc, max(frag.start, frag.end - 1)),  # the best fragment's last line
        } | kind_view(out, doc, frag)
        if len(seen) >= limit:
            break
    return list(seen.values())
