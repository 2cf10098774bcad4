"""What a captured conversation is: turns by speakers, with a session date.

A :class:`Conversation` comes out of :func:`memoriesd.conversations.transcripts.parse` and is stored as
one record of kind ``conversation`` (:mod:`memoriesd.conversations.capture`): its body is the turns
rendered as ``{speaker}: {text}`` blocks joined by a blank line, and its metadata says where each
turn's block starts and ends (byte offsets), so fragments, search results and extracted facts can
name turns ("T3") and the source's own turn ids (LoCoMo ``D1:3``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

#: Between two rendered turns in a record body.
TURN_SEPARATOR = "\n\n"

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")


@dataclass(frozen=True)
class Turn:
    """One turn: ``id`` is "T1".."Tn" in record order; ``ref`` the source's own id (LoCoMo ``dia_id``)."""

    id: str
    speaker: str
    text: str
    time: str | None = None  # ISO 8601 as the source gave it
    ref: str | None = None

    def render(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Conversation:
    """A parsed conversation (one session)."""

    turns: tuple[Turn, ...]
    title: str
    date: str | None  # ISO date or datetime of the session
    session_id: str | None
    format: str  # jsonl | claude-code | markdown | locomo

    @property
    def speakers(self) -> list[str]:
        """Distinct speakers in order of their first turn."""
        return list(dict.fromkeys(t.speaker for t in self.turns))

    def body_and_spans(self) -> tuple[str, list[tuple[int, int]]]:
        """The record body and each turn's ``(start, end)`` byte range in ``body.encode("utf-8")``."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        sep = len(TURN_SEPARATOR.encode("utf-8"))
        for i, t in enumerate(self.turns):
            block = t.render()
            if i:
                parts.append(TURN_SEPARATOR)
                pos += sep
            n = len(block.encode("utf-8"))
            spans.append((pos, pos + n))
            parts.append(block)
            pos += n
        return "".join(parts), spans

    def content_sha256(self) -> str:
        """Hash of the canonical turns (speaker, text, time, ref): what "the same session" means."""
        canon = [[t.speaker, t.text, t.time, t.ref] for t in self.turns]
        return hashlib.sha256(json.dumps(canon, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def renumber(turns: list[tuple[str, str, str | None, str | None]]) -> tuple[Turn, ...]:
    """Turns from ``(speaker, text, time, ref)`` tuples, numbered T1..Tn."""
    return tuple(Turn(f"T{i}", s, x, tm, r) for i, (s, x, tm, r) in enumerate(turns, start=1))


def parse_iso(value: str) -> date | datetime | None:
    """An ISO 8601 date or datetime (``Z`` allowed), else None."""
    v = value.strip()
    if not v:
        return None
    try:
        if len(v) == 10:
            return date.fromisoformat(v)
        return datetime.fromisoformat(v[:-1] + "+00:00" if v.endswith(("Z", "z")) else v)
    except ValueError:
        return None


def session_day(value: str | None) -> str | None:
    """``YYYY-MM-DD`` of an ISO date or datetime, else None."""
    got = parse_iso(value) if value else None
    if got is None:
        return None
    return (got.date() if isinstance(got, datetime) else got).isoformat()


def session_when(value: str | None) -> str | None:
    """A human form that BM25 and the embedder can match: "8 May 2023, 1:56 pm" (the time as the
    source gave it, no time zone conversion), or "8 May 2023" for a date alone."""
    got = parse_iso(value) if value else None
    if got is None:
        return None
    day = f"{got.day} {_MONTHS[got.month - 1]} {got.year}"
    if not isinstance(got, datetime):
        return day
    hour = got.hour % 12 or 12
    return f"{day}, {hour}:{got.minute:02d} {'am' if got.hour < 12 else 'pm'}"


def derived_title(conv_speakers: list[str], when: str | None, session: int | None = None) -> str:
    """"Caroline and Melanie, session 3" / "user and assistant, 8 May 2023"."""
    names = conv_speakers[:4]
    if not names:
        who = "Conversation"
    elif len(names) == 1:
        who = f"Conversation with {names[0]}"
    else:
        who = ", ".join(names[:-1]) + f" and {names[-1]}"
        if len(conv_speakers) > 4:
            who = ", ".join(names) + " and others"
    if session is not None:
        return f"{who}, session {session}"
    if when:
        return f"{who}, {when.split(',')[0]}"
    return who


def meta_for(conv: Conversation, key: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
    """The record's metadata (see the design in the module docstring of :mod:`.capture`)."""
    meta: dict[str, Any] = {"speakers": conv.speakers}
    day = session_day(conv.date)
    when = session_when(conv.date)
    if day:
        meta["session_date"] = day
    if when:
        meta["session_when"] = when
    meta["conversation"] = {
        "session_id": conv.session_id,
        "key": key,
        "format": conv.format,
        "date": conv.date,
        "content_sha256": conv.content_sha256(),
        "turns": [[s, e, t.speaker, t.time, t.ref] for (s, e), t in zip(spans, conv.turns, strict=True)],
    }
    return meta


__all__ = [
    "Conversation",
    "TURN_SEPARATOR",
    "Turn",
    "derived_title",
    "meta_for",
    "parse_iso",
    "renumber",
    "session_day",
    "session_when",
]
