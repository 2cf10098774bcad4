"""The conversation kind: captured chats (``memory capture``), kind ``conversation``.

How a conversation is cut and its turn windows (:mod:`.turns`; the windows are searched by
:mod:`memoriesd.index.vectors.windows`), and what the filters and search results read of it, as
one :class:`~.base.RecordKind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from ..text.fragments import Fragment
from ..vault.records import Record
from .base import PlainKind, Spans, day_of
from .turns import (
    KIND,
    MAX_TURNS,
    WINDOW_TURNS,
    conversation_view,
    split_conversation,
    turn_spans,
    turn_windows,
)


@dataclass(frozen=True)
class ConversationKind(PlainKind):
    """A conversation is cut at turn boundaries, has turn windows (:func:`.turns.turn_windows`), its
    session's time in its embedding title, its session date as its day, speakers for ``--speaker``,
    and its turns in search results (:func:`conversation_view`)."""

    name: str = KIND
    has_speakers: bool = True
    max_windows: int = MAX_TURNS - WINDOW_TURNS + 1  # a fragment holds at most MAX_TURNS (12) turns
    # A session's fragments are its exchanges, each a result of its own: one hit per session hid the
    # exchange that answers behind another of the same session (docs/memory.md, "Conversations").
    one_result: bool = False

    def fragments(self, rec: Record, fp_key: bytes) -> list[Fragment]:
        return split_conversation(rec, fp_key)

    def windows(self, rec: Record, fragments: Sequence[Fragment]) -> tuple[tuple[Fragment, ...], ...]:
        return turn_windows(rec, fragments)

    def when(self, rec: Record) -> str | None:
        return str(rec.meta.get("session_when") or "") or None

    def embed_title(self, title: str, source: str | None) -> str | None:
        return title or None

    def own_day(self, rec: Record) -> date | None:
        return day_of(rec.meta.get("session_date"))

    def speaker_spans(self, rec: Record, speakers: frozenset[str]) -> Spans:
        return tuple((t.start, t.end) for t in turn_spans(rec) or () if t.speaker.casefold() in speakers)

    def result_view(self, rec: Record, start: int, end: int) -> dict[str, Any] | None:
        return conversation_view(rec, start, end)

    @property
    def has_view(self) -> bool:
        return True


__all__ = ["KIND", "ConversationKind"]
