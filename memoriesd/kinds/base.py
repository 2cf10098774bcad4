"""What a record kind answers (:class:`RecordKind`) and the plain-text answers every kind starts
from (:class:`PlainKind`). Kinds are registered in :mod:`.registry`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from ..text.files import parse_front_matter
from ..text.fragments import Fragment, split_fragments
from ..vault.records import Record

#: The most windows (extra vectors, :meth:`RecordKind.windows`) a fragment of any kind may have:
#: window keys are derived from fragment ids with room for this many (index/vectors/windows.py).
MAX_WINDOWS = 32
#: Byte ranges ``(start, end)`` of a record's body.
Spans = tuple[tuple[int, int], ...]
_DAY = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})(?:$|[T ]|\s)")  # an ISO date, maybe with a time


def day_of(value: object) -> date | None:
    """The day an ISO date (or date and time) string starts with, else None."""
    m = _DAY.match(value) if isinstance(value, str) else None
    if m is None:
        return None
    try:
        return date.fromisoformat(m.group(1))
    except ValueError:
        return None


class RecordKind(Protocol):
    """How one kind of record is fragmented, titled, embedded, dated, filtered and shown."""

    @property
    def name(self) -> str:
        """The ``kind`` of the records it handles."""
        ...

    @property
    def categories(self) -> tuple[str, ...]:
        """``--category`` values its records can hold (empty: ``--category`` never selects it)."""
        ...

    @property
    def has_speakers(self) -> bool:
        """Whether ``--speaker`` can select its records (they have turns)."""
        ...

    @property
    def max_windows(self) -> int:
        """The most windows :meth:`windows` gives a fragment (at most :data:`MAX_WINDOWS`)."""
        ...

    @property
    def one_result(self) -> bool:
        """Whether `rag search` shows one result per record (its best fragment, "+N more"), or each
        fragment as a result of its own (:mod:`memoriesd.rag.documents`)."""
        ...

    def body_start(self, rec: Record) -> int:
        """Character offset where the record's indexed text starts (fragment offsets still count
        from the body's first byte)."""
        ...

    def fragments(self, rec: Record, fp_key: bytes) -> list[Fragment]:
        """The record's fragments, fingerprinted with ``fp_key``."""
        ...

    def windows(self, rec: Record, fragments: Sequence[Fragment]) -> tuple[tuple[Fragment, ...], ...]:
        """Extra vectors per fragment (aligned with ``fragments``): ``()`` when the kind has none."""
        ...

    def when(self, rec: Record) -> str | None:
        """Words of the record's time that the embedder reads with its title, or None."""
        ...

    def embed_title(self, title: str, source: str | None) -> str | None:
        """The title the embedder reads (``title`` stripped; None: embed without one)."""
        ...

    def own_day(self, rec: Record) -> date | None:
        """The record's own day for ``--since``/``--until`` (None: its creation day)."""
        ...

    def category(self, rec: Record) -> str | None:
        """The record's ``--category`` value (None for kinds without categories)."""
        ...

    def speaker_spans(self, rec: Record, speakers: frozenset[str]) -> Spans:
        """Byte ranges of the record's turns by one of ``speakers`` (casefolded), in order."""
        ...

    def result_view(self, rec: Record, start: int, end: int) -> dict[str, Any] | None:
        """What a search result shows of a fragment beyond its text, under the kind's name."""
        ...

    @property
    def has_view(self) -> bool:
        """Whether search results of this kind carry :meth:`result_view` under the kind's name."""
        ...


@dataclass(frozen=True)
class PlainKind:
    """A kind of plain text: fragments cut by :func:`split_fragments`, no windows, no turns. The
    default of every :class:`RecordKind` method; a kind overrides what it does differently."""

    name: str
    categories: tuple[str, ...] = ()
    has_speakers: bool = False
    max_windows: int = 0
    one_result: bool = True

    def body_start(self, rec: Record) -> int:
        """Character offset where the indexed text starts (0: the whole body)."""
        return 0

    def fragments(self, rec: Record, fp_key: bytes) -> list[Fragment]:
        return split_fragments(rec.id, rec.revision, rec.body, fp_key, skip=self.body_start(rec))

    def windows(self, rec: Record, fragments: Sequence[Fragment]) -> tuple[tuple[Fragment, ...], ...]:
        return ()

    def when(self, rec: Record) -> str | None:
        return None

    def embed_title(self, title: str, source: str | None) -> str | None:
        return title or None

    def own_day(self, rec: Record) -> date | None:
        """Front matter ``date:`` when the body starts with front matter."""
        if not rec.body.startswith("---"):
            return None
        fm = parse_front_matter(rec.body)
        return day_of(fm[0].get("date")) if fm is not None else None

    def category(self, rec: Record) -> str | None:
        return None

    def speaker_spans(self, rec: Record, speakers: frozenset[str]) -> Spans:
        return ()

    def result_view(self, rec: Record, start: int, end: int) -> dict[str, Any] | None:
        return None

    @property
    def has_view(self) -> bool:
        return False


__all__ = ["MAX_WINDOWS", "PlainKind", "RecordKind", "Spans", "day_of"]
