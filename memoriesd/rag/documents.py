"""One hit per document: `rag search`'s default grouping of ranked fragments.

**What a document is.** A *record*: every kind of record the vault holds (:mod:`memoriesd.kinds`) is
one thing a person thinks of as a unit, so the record is what a result stands for and what
``--limit`` counts:

- an ingested or watched file is one ``card`` record (``rag ingest`` and ``rag watch`` make exactly
  one card per file, front matter included), so a card is "this file";
- a note (``memory``) and a ``fact`` are one record each, written as a whole;
- a captured ``conversation`` is one record per session (``memory capture``), cut at turn
  boundaries into fragments, and is the exception: each fragment (an exchange) is a result of its own
  (:attr:`memoriesd.kinds.base.RecordKind.one_result`), since a session holds many topics and one
  hit per session hid the exchange that answers behind another of the same session (LoCoMo dev
  conversations: every evidence turn in the top 10 for 0.800 of the questions grouped, 0.909 not).

Nothing smaller (a fragment, a turn window) is a document, and nothing larger (a folder, a tag) is
one either: two files of a folder are two results, as in a file search. A record's revision does not
split it: search only ranks the live revision of each record.

**The grouping.** The search ranks fragments as ever (:func:`memoriesd.rag.search.run_search`); this
step keeps, per record, its best fragment in the place of that fragment, and counts the record's
other fragments among the ranked ones ("+N more in this file", with their line ranges). Ranking a
document by its best fragment (max-pooling) is what the evaluations have always done
(``bench/eval_beir.py``), so the order of documents is the order of their first fragment in the
per-fragment list: grouping never reorders, it removes repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..index.docs import IndexedDoc
from ..kinds.registry import kind_of
from .fusion import Candidate

#: How much the fragment candidates grow at a time while the ranked fragments hold fewer documents
#: than ``--limit`` asks for (the search widens each side's candidates by this factor).
WIDEN = 4


@dataclass(frozen=True)
class DocumentHit:
    """A document's place in a ranking: its best fragment, then its other ranked fragments, best first."""

    record_id: str
    best: Candidate
    others: tuple[Candidate, ...] = ()

    @property
    def more(self) -> int:
        """How many more fragments of the document were ranked (the "+N more")."""
        return len(self.others)


def document_key(doc: IndexedDoc, frag_id: int) -> str:
    """What a fragment's hit groups under: its record, or itself for a kind whose fragments are
    results of their own (a conversation's exchanges: :attr:`RecordKind.one_result`)."""
    return doc.record_id if kind_of(doc.kind).one_result else f"{doc.record_id}#{frag_id}"


def group_by_document(hits: Sequence[Candidate], record_of: Callable[[int], str | None]) -> list[DocumentHit]:
    """``hits`` (best first) grouped by the record each fragment belongs to, in the order of each
    record's best fragment; a fragment whose record is unknown (gone meanwhile) is left out."""
    order: list[str] = []
    best: dict[str, Candidate] = {}
    others: dict[str, list[Candidate]] = {}
    for c in hits:
        rid = record_of(c.frag_id)
        if rid is None:
            continue
        if rid in best:
            others[rid].append(c)
        else:
            order.append(rid)
            best[rid] = c
            others[rid] = []
    return [DocumentHit(rid, best[rid], tuple(others[rid])) for rid in order]


@dataclass(frozen=True)
class Span:
    """Where a fragment lies in its record: bytes ``[start, end)`` and 1-based lines (None: unknown)."""

    start: int
    end: int
    line: int | None
    end_line: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "line": self.line, "end_line": self.end_line}


def group_fields(group: DocumentHit | None, span_of: Callable[[int], Span | None]) -> dict[str, Any]:
    """The fields a grouped result adds to its best fragment's: ``matches`` (fragments of the document
    among the ranked ones, the best included), ``more`` (``matches - 1``) and ``more_fragments``
    (the others' spans, in the order they come in the document). ``{}`` outside grouping."""
    if group is None:
        return {}
    spans = [s for c in group.others if (s := span_of(c.frag_id)) is not None]
    spans.sort(key=lambda s: s.start)
    return {"matches": 1 + group.more, "more": group.more, "more_fragments": [s.to_dict() for s in spans]}


__all__ = ["WIDEN", "DocumentHit", "Span", "document_key", "group_by_document", "group_fields"]
