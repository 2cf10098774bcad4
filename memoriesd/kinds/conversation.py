"""The conversation kind: captured chats (``memory capture``), kind ``conversation``.

How a conversation is cut (:mod:`.turns`), its extra vectors (:mod:`.turn_windows`), and what the
filters and search results read of it, as one :class:`~.base.RecordKind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from ..index.vectors.windows import turn_windows
from ..text.fragments import Fragment
from .base import PlainKind, Spans, day_of
from .turns import KIND, conversation_view, split_conversation, turn_spans


@dataclass(frozen=True)
class ConversationKind(PlainKind):
    """A conversation is cut at turn boundaries, has turn windows (:mod:`.turn_windows`), its
    session's time in its embedding title, its session date as its day, speakers for ``--speaker``,
    and its turns in search results (:func:`conversation_view`)."""

    name: str = KIND
    has_speakers: bool = True

    def fragments(self, rec: Any, fp_key: bytes) -> list[Fragment]:
        return split_conversation(rec, fp_key)

    def windows(self, rec: Any, fragments: Sequence[Fragment]) -> tuple[tuple[Fragment, ...], ...]:
        return turn_windows(rec, fragments)

    def when(self, rec: Any) -> str | None:
        return str(rec.meta.get("session_when") or "") or None

    def embed_title(self, title: str, source: str | None) -> str | None:
        return title or None

    def own_day(self, rec: Any) -> date | None:
        return day_of(rec.meta.get("session_date"))

    def speaker_spans(self, rec: Any, speakers: frozenset[str]) -> Spans:
        return tuple((t.start, t.end) for t in turn_spans(rec) or () if t.speaker.casefold() in speakers)

    def result_view(self, rec: Any, start: int, end: int) -> dict[str, Any] | None:
        return conversation_view(rec, start, end)

    @property
    def has_view(self) -> bool:
        return True


__all__ = ["KIND", "ConversationKind"]
