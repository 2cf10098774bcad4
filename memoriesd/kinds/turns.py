"""Fragments of a conversation record: whole turns, grouped.

A conversation's body is its turns rendered as ``{speaker}: {text}`` blocks joined by a blank line,
and ``meta["conversation"]["turns"]`` holds each block's byte range (:mod:`.model`). Fragments are
cut at those boundaries: consecutive whole turns are grouped while the group stays within
:data:`MAX_CHARS` characters and :data:`MAX_TURNS` turns, so a search result is a few complete
turns and never half of one with the start of the next. A turn longer than :data:`MAX_CHARS` is
alone and split like any text (:func:`memoriesd.text.fragments.split_fragments`, offsets shifted).
With :data:`OVERLAP_TURNS`, a fragment starts with the last short turn(s) of the one before (a
question stays in front of its answer).

Byte offsets and fingerprints are those of :mod:`memoriesd.text.fragments`:
``body.encode()[f.start:f.end].decode() == f.text``, and the lexical snapshot restores conversation
fragments from their byte ranges like any other. A record whose turn metadata does not fit its
body (edited by hand with `memory update`) is cut like plain text.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..text.fragments import Fragment, fingerprint, split_fragments
from ..vault.records import Record
from .base import MAX_WINDOWS

KIND = "conversation"
#: Largest fragment, in characters, that grouping whole turns may make: about six turns of chat.
#: Measured with BM25 on the LoCoMo dev files (bench/eval_conversations.py, 230 questions):
#: 1024/12/1 gave recall_all@10 0.83 (768/8/1: 0.77, 512/6/1: 0.73, 1280/16/1: 0.82; the
#: note-per-session baseline 0.81), and a 1,000-token pack held some evidence for 0.835 (768/8/1:
#: 0.82). Smaller groups rank one turn better but spread the evidence over more results.
MAX_CHARS = 1024
#: At most this many turns per fragment, however short they are (greetings, "ok", "thanks").
MAX_TURNS = 12
#: Turns of the previous fragment repeated at the start of the next one (0: no overlap): a question
#: at the end of a fragment stays in front of its answer (768/8 without it: 0.74).
#: Turns per turn window (:func:`turn_windows`): a question and its answer.
WINDOW_TURNS = 2
OVERLAP_TURNS = 1
#: Only a turn shorter than this share of MAX_CHARS is repeated as overlap.
OVERLAP_SHARE = 0.25
#: Overlap, in characters, of the pieces of one turn longer than MAX_CHARS.
LONG_TURN_OVERLAP = 128


@dataclass(frozen=True)
class TurnSpan:
    """Where one turn sits in the record body."""

    index: int  # 0-based; its id is f"T{index + 1}"
    start: int
    end: int
    speaker: str
    time: str | None
    ref: str | None

    @property
    def id(self) -> str:
        return f"T{self.index + 1}"

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "speaker": self.speaker, "ref": self.ref, "time": self.time}


def turn_spans(rec: Record) -> list[TurnSpan] | None:
    """The record's turns from its metadata, or None when it is not a conversation or its turn
    ranges do not fit its body (in order, inside it, each starting with ``speaker:``)."""
    if rec.kind != KIND:
        return None
    conv = rec.meta.get("conversation")
    turns = conv.get("turns") if isinstance(conv, dict) else None
    if not isinstance(turns, list) or not turns:
        return None
    data = rec.body.encode("utf-8")
    out: list[TurnSpan] = []
    prev = 0
    for i, t in enumerate(turns):
        if not isinstance(t, list) or len(t) != 5:
            return None
        start, end, speaker, time, ref = t
        if not (isinstance(start, int) and isinstance(end, int) and isinstance(speaker, str)):
            return None
        if not prev <= start < end <= len(data) or not data.startswith(speaker.encode("utf-8") + b":", start):
            return None
        out.append(TurnSpan(i, start, end, speaker, time if isinstance(time, str) else None, None if ref is None else str(ref)))
        prev = end
    return out


def turns_in(rec: Record, start: int, end: int) -> list[dict[str, Any]]:
    """``{"id": "T3", "speaker", "ref", "time"}`` of the turns overlapping the byte range ``[start, end)``."""
    spans = turn_spans(rec) or []
    return [t.view() for t in spans if t.start < end and start < t.end]


def conversation_view(rec: Record, start: int, end: int) -> dict[str, Any]:
    """What a search result says about a conversation fragment: ``{date, when, speakers, turns, refs}``."""
    turns = turns_in(rec, start, end)
    return {
        "date": rec.meta.get("session_date"),
        "when": rec.meta.get("session_when"),
        "speakers": list(dict.fromkeys(str(t["speaker"]) for t in turns)),
        "turns": [t["id"] for t in turns],
        "refs": [t["ref"] for t in turns if t["ref"] is not None],
    }


def _groups(sizes: list[int]) -> list[tuple[int, int]]:
    """Turn index ranges ``[first, last]`` of the fragments, from each turn's size in characters.
    A turn over MAX_CHARS is a group of its own (split later)."""
    groups: list[tuple[int, int]] = []
    first = -1
    chars = 0
    for i, n in enumerate(sizes):
        if n > MAX_CHARS:
            if first >= 0:
                groups.append((first, i - 1))
            groups.append((i, i))
            first, chars = -1, 0
            continue
        if first >= 0 and (chars + 2 + n > MAX_CHARS or i - first >= MAX_TURNS):
            groups.append((first, i - 1))
            # Overlap: the last short turn(s) of that group open the next one, when all fits.
            keep = 0
            carried = 0
            while keep < OVERLAP_TURNS and i - 1 - keep > first:
                m = sizes[i - 1 - keep]
                if m > OVERLAP_SHARE * MAX_CHARS or carried + m + 2 + n > MAX_CHARS:
                    break
                carried += m + 2
                keep += 1
            first, chars = (i - keep, sum(sizes[i - keep : i]) + 2 * (keep - 1)) if keep else (-1, 0)
        if first < 0:
            first, chars = i, n
        else:
            chars += 2 + n
    if first >= 0:
        groups.append((first, len(sizes) - 1))
    return groups


def split_conversation(rec: Record, fp_key: bytes) -> list[Fragment]:
    """The record's fragments, cut at turn boundaries (see the module docstring)."""
    spans = turn_spans(rec)
    if spans is None:
        return split_fragments(rec.id, rec.revision, rec.body, fp_key)
    data = rec.body.encode("utf-8")
    try:
        blocks = [data[t.start : t.end].decode("utf-8") for t in spans]
    except UnicodeDecodeError:  # a range that cuts a character: not this body's turns
        return split_fragments(rec.id, rec.revision, rec.body, fp_key)
    frags: list[Fragment] = []

    def emit(bs: int, be: int, text: str) -> None:
        frags.append(Fragment(rec.id, rec.revision, len(frags), bs, be, text, fingerprint(fp_key, bs, be, data[bs:be])))

    for first, last in _groups([len(b) for b in blocks]):
        if first == last and len(blocks[first]) > MAX_CHARS:
            base = spans[first].start
            for piece in split_fragments(rec.id, rec.revision, blocks[first], fp_key, max_chars=MAX_CHARS, overlap=LONG_TURN_OVERLAP):
                emit(base + piece.start, base + piece.end, piece.text)
            continue
        bs, be = spans[first].start, spans[last].end
        emit(bs, be, data[bs:be].decode("utf-8"))
    return frags



def turn_windows(rec: Record, fragments: Sequence[Fragment]) -> tuple[tuple[Fragment, ...], ...]:
    """For each fragment of a conversation record (in order), its windows: fragments of
    :data:`WINDOW_TURNS` consecutive whole turns inside it, with the fragment's ordinal. A fragment
    of fewer than three turns (or part of one long turn) has none. ``()`` when the record's turn
    metadata does not fit its body."""
    spans = turn_spans(rec)
    if not spans:
        return ()
    data = rec.body.encode("utf-8")
    starts = [t.start for t in spans]
    out: list[tuple[Fragment, ...]] = []
    for f in fragments:
        lo = bisect.bisect_left(starts, f.start)
        hi = lo
        while hi < len(spans) and spans[hi].end <= f.end:
            hi += 1
        inside = spans[lo:hi]
        if len(inside) <= WINDOW_TURNS:
            out.append(())
            continue
        wins: list[Fragment] = []
        for j in range(min(len(inside) - WINDOW_TURNS + 1, MAX_WINDOWS)):
            s, e = inside[j].start, inside[j + WINDOW_TURNS - 1].end
            try:
                text = data[s:e].decode("utf-8")
            except UnicodeDecodeError:  # turn_spans checked the ranges; never cut a character
                break
            wins.append(Fragment(rec.id, rec.revision, f.ordinal, s, e, text, ""))
        out.append(tuple(wins))
    return tuple(out)


__all__ = [
    "KIND",
    "MAX_CHARS",
    "MAX_TURNS",
    "OVERLAP_TURNS",
    "WINDOW_TURNS",
    "TurnSpan",
    "conversation_view",
    "split_conversation",
    "turn_spans",
    "turn_windows",
    "turns_in",
]
