"""Search filters: ``--kind``, ``--category``, ``--tag``, ``--since/--until`` and ``--speaker``.

A :class:`RecordFilter` says which records a search (``rag search``, ``rag context``) may return.
It is applied to the candidates of both sides, BM25 and vector, before they are fused
(:func:`memoriesd.rag.search.run_search`), so a filtered search ranks among the records that pass,
instead of filtering a ranking made for the whole vault.

- ``kinds``: the record's kind is one of them (memory, card, fact, conversation);
- ``categories``: a fact of one of these categories (implies kind fact);
- ``tags``: the record carries every one of them (case-insensitive);
- ``since`` / ``until``: the record's own day is within them, both ends included. A record's own
  day is its front matter ``date:`` (``YYYY-MM-DD``, a time after it ignored) when its text starts
  with one, else the day it was created (the daemon's local time). A fact's day is the day it was
  first remembered; a revision does not move it. A conversation's day is its session date
  (``meta.session_date``) when known, else the day it was captured;
- ``speakers``: only conversation fragments holding a turn by one of them (case-insensitive). This
  one works per fragment, not per record: a record passes when some turn is by one of them
  (:meth:`RecordFilter.keeps`), and of its fragments only those that overlap the byte range of such
  a turn (``meta.conversation.turns``) may be returned (:meth:`RecordFilter.allowed_records`).
  Records that are not conversations never pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

from ..errors import QueryInvalid
from ..kinds.base import Spans
from ..kinds.card import KIND as CARD
from ..kinds.registry import kind_names, kind_of
from ..kinds.registry import kinds as kinds_registered
from ..vault.records import Record
from ..vault.store import VaultStore

MAX_TAGS = 64
MAX_SPEAKERS = 64
MAX_SPEAKER_CHARS = 200
#: Byte ranges ``(start, end)`` of a record's body; per record: the ranges its fragments must overlap
#: (the turns of the wanted speakers), or None when any fragment of it may be returned.
Allowed = Mapping[str, Spans | None]
_ISO_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_day(value: str, option: str) -> date:
    """An ISO date (``2024-05-31``); ``query_invalid`` naming ``option`` otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if _ISO_DAY.match(text):
        try:
            return date.fromisoformat(text)
        except ValueError:  # 2024-02-30
            pass
    raise QueryInvalid(f"{option} takes an ISO date like 2024-05-31 (got {str(value)[:40]!r})")


def record_day(rec: Record) -> date:
    """The record's own day as its kind reads it (a conversation's session date, a card's front
    matter ``date:``), else its creation day (module docstring)."""
    day = kind_of(rec.kind).own_day(rec)
    return day if day is not None else datetime.fromtimestamp(rec.created).date()


def speaker_spans(rec: Record, speakers: frozenset[str]) -> Spans:
    """The byte ranges of the record's turns by one of ``speakers`` (casefolded names), in order;
    none for a record whose kind has no turns (or whose turns do not fit its body)."""
    return kind_of(rec.kind).speaker_spans(rec, speakers)


def overlaps(spans: Spans, start: int, end: int) -> bool:
    """Whether the byte range ``[start, end)`` overlaps one of ``spans``."""
    return any(s < end and start < e for s, e in spans)


@dataclass(frozen=True)
class RecordFilter:
    kinds: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    since: date | None = None
    until: date | None = None
    speakers: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.kinds or self.categories or self.tags or self.since or self.until or self.speakers)

    @property
    def _wanted(self) -> frozenset[str]:
        return frozenset(s.casefold() for s in self.speakers)

    def only_cards(self) -> RecordFilter:
        """This filter narrowed to knowledge cards (a cards-only grant); may then keep nothing."""
        kinds = tuple(k for k in self.kinds if k == CARD) if self.kinds else (CARD,)
        return replace(self, kinds=kinds or ("none",), categories=())

    def keeps(self, rec: Record) -> bool:
        return self._keeps_record(rec) and (not self.speakers or bool(speaker_spans(rec, self._wanted)))

    def _keeps_record(self, rec: Record) -> bool:
        """Every test but ``--speaker``'s."""
        if self.kinds and rec.kind not in self.kinds:
            return False
        if self.categories and kind_of(rec.kind).category(rec) not in self.categories:
            return False
        if self.tags:
            have = {t.casefold() for t in rec.tags}
            if not all(t.casefold() in have for t in self.tags):
                return False
        if self.since is not None or self.until is not None:
            day = record_day(rec)
            if (self.since is not None and day < self.since) or (self.until is not None and day > self.until):
                return False
        return True

    def fragment_spans(self, rec: Record) -> Spans | None:
        """The ranges a fragment of ``rec`` must overlap (``--speaker``), or None: any fragment."""
        return speaker_spans(rec, self._wanted) if self.speakers else None

    def keeps_fragment(self, rec: Record, start: int, end: int) -> bool:
        """Whether the fragment ``[start, end)`` of a record that passes may be returned."""
        spans = self.fragment_spans(rec)
        return spans is None or overlaps(spans, start, end)

    def record_ids(self, store: VaultStore) -> set[str]:
        """The searchable records of the vault that pass."""
        return {r.id for r in store.latest() if r.searchable and self.keeps(r)}

    def allowed_records(self, store: VaultStore) -> dict[str, Spans | None]:
        """The searchable records that pass, each with the ranges its fragments must overlap."""
        out: dict[str, Spans | None] = {}
        for r in store.latest():
            if r.searchable and self._keeps_record(r):
                spans = self.fragment_spans(r)  # the turns are read once per record
                if spans is None or spans:
                    out[r.id] = spans
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds),
            "categories": list(self.categories),
            "tags": list(self.tags),
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "speakers": list(self.speakers),
        }


def make_filter(
    kinds: list[str],
    categories: list[str],
    tags: list[str],
    since: str | None,
    until: str | None,
    speakers: list[str] | None = None,
) -> RecordFilter:
    """A validated filter from request values (``query_invalid`` with what to give instead)."""
    names = kind_names()
    bad = [k for k in kinds if k not in names]
    if bad:
        raise QueryInvalid(
            f"--kind takes {', '.join(names)} (credentials and files are never searched), not {bad[0]!r}"
        )
    with_categories = [k.name for k in kinds_registered() if k.categories]
    all_categories = tuple(dict.fromkeys(c for k in kinds_registered() for c in k.categories))
    bad = [c for c in categories if c not in all_categories]
    if bad:
        raise QueryInvalid(f"--category takes {', '.join(all_categories)}, not {bad[0]!r}")
    if categories and kinds and not set(with_categories) & set(kinds):
        raise QueryInvalid(f"--category selects {_plural(with_categories)}: drop --kind, or add --kind {with_categories[0]}")
    clean_tags = []
    for t in tags:
        t = t.strip()
        if not t or len(t) > 100:
            raise QueryInvalid("--tag takes a tag of 1 to 100 characters")
        clean_tags.append(t)
    if len(clean_tags) > MAX_TAGS:
        raise QueryInvalid(f"at most {MAX_TAGS} --tag options")
    clean_speakers = _speakers(speakers or [], kinds, categories)
    lo = parse_day(since, "--since") if since else None
    hi = parse_day(until, "--until") if until else None
    if lo is not None and hi is not None and lo > hi:
        raise QueryInvalid(f"--since {lo.isoformat()} is after --until {hi.isoformat()}: swap them")
    return RecordFilter(
        tuple(dict.fromkeys(kinds)),
        tuple(dict.fromkeys(categories)),
        tuple(dict.fromkeys(clean_tags)),
        lo,
        hi,
        clean_speakers,
    )


def _plural(names: list[str]) -> str:
    """``["fact"]`` -> ``facts``: the kinds a filter option selects, in words."""
    return " or ".join(f"{n}s" for n in names)


def _speakers(speakers: list[str], kinds: list[str], categories: list[str]) -> tuple[str, ...]:
    """Validated ``--speaker`` names (kept as given, matched case-insensitively), once each."""
    clean: dict[str, str] = {}
    for s in speakers:
        s = s.strip()
        if not s or len(s) > MAX_SPEAKER_CHARS:
            raise QueryInvalid(f"--speaker takes a name of 1 to {MAX_SPEAKER_CHARS} characters")
        clean.setdefault(s.casefold(), s)
    if len(clean) > MAX_SPEAKERS:
        raise QueryInvalid(f"at most {MAX_SPEAKERS} --speaker options")
    with_speakers = [k.name for k in kinds_registered() if k.has_speakers]
    with_categories = [k.name for k in kinds_registered() if k.categories]
    if clean and categories:
        raise QueryInvalid(
            f"--speaker selects {_plural(with_speakers)} and --category selects {_plural(with_categories)}: drop one of them"
        )
    if clean and kinds and not set(with_speakers) & set(kinds):
        raise QueryInvalid(f"--speaker selects {_plural(with_speakers)}: drop --kind, or add --kind {with_speakers[0]}")
    return tuple(clean.values())


__all__ = [
    "Allowed",
    "RecordFilter",
    "Spans",
    "make_filter",
    "overlaps",
    "parse_day",
    "record_day",
    "speaker_spans",
]
