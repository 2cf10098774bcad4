"""Search filters: ``--kind``, ``--category``, ``--tag`` and ``--since/--until``.

A :class:`RecordFilter` says which records a search (``rag search``, ``rag context``) may return.
It is applied to the candidates of both sides, BM25 and vector, before they are fused
(:func:`memoriesd.rag.search.run_search`), so a filtered search ranks among the records that pass,
instead of filtering a ranking made for the whole vault.

- ``kinds``: the record's kind is one of them (memory, card, fact);
- ``categories``: a fact of one of these categories (implies kind fact);
- ``tags``: the record carries every one of them (case-insensitive);
- ``since`` / ``until``: the record's own day is within them, both ends included. A record's own
  day is its front matter ``date:`` (``YYYY-MM-DD``, a time after it ignored) when its text starts
  with one, else the day it was created (the daemon's local time). A fact's day is the day it was
  first remembered; a revision does not move it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

from ..errors import QueryInvalid
from ..memory.facts import CATEGORIES, KIND, category_of
from ..text.documents import parse_front_matter
from ..vault.records import Record
from ..vault.store import VaultStore

#: Kinds a search can return (credentials and files are never indexed).
FILTER_KINDS = ("memory", "card", "fact")
MAX_TAGS = 64
_DAY = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})(?:$|[T ]|\s)")  # a front matter date, maybe with a time
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
    """The record's own day: front matter ``date:``, else its creation day (module docstring)."""
    if rec.body.startswith("---") and rec.kind != KIND:
        fm = parse_front_matter(rec.body)
        value = fm[0].get("date") if fm is not None else None
        if isinstance(value, str):
            m = _DAY.match(value)
            if m is not None:
                try:
                    return date.fromisoformat(m.group(1))
                except ValueError:
                    pass
    return datetime.fromtimestamp(rec.created).date()


@dataclass(frozen=True)
class RecordFilter:
    kinds: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    since: date | None = None
    until: date | None = None

    @property
    def active(self) -> bool:
        return bool(self.kinds or self.categories or self.tags or self.since or self.until)

    def only_cards(self) -> RecordFilter:
        """This filter narrowed to knowledge cards (a cards-only grant); may then keep nothing."""
        kinds = tuple(k for k in self.kinds if k == "card") if self.kinds else ("card",)
        return replace(self, kinds=kinds or ("none",), categories=())

    def keeps(self, rec: Record) -> bool:
        if self.kinds and rec.kind not in self.kinds:
            return False
        if self.categories and (rec.kind != KIND or category_of(rec) not in self.categories):
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

    def record_ids(self, store: VaultStore) -> set[str]:
        """The searchable records of the vault that pass."""
        return {r.id for r in store.latest() if r.searchable and self.keeps(r)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds),
            "categories": list(self.categories),
            "tags": list(self.tags),
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }


def make_filter(
    kinds: list[str], categories: list[str], tags: list[str], since: str | None, until: str | None
) -> RecordFilter:
    """A validated filter from request values (``query_invalid`` with what to give instead)."""
    bad = [k for k in kinds if k not in FILTER_KINDS]
    if bad:
        raise QueryInvalid(
            f"--kind takes {', '.join(FILTER_KINDS)} (credentials and files are never searched), not {bad[0]!r}"
        )
    bad = [c for c in categories if c not in CATEGORIES]
    if bad:
        raise QueryInvalid(f"--category takes {', '.join(CATEGORIES)}, not {bad[0]!r}")
    if categories and kinds and KIND not in kinds:
        raise QueryInvalid("--category selects facts: drop --kind, or add --kind fact")
    clean_tags = []
    for t in tags:
        t = t.strip()
        if not t or len(t) > 100:
            raise QueryInvalid("--tag takes a tag of 1 to 100 characters")
        clean_tags.append(t)
    if len(clean_tags) > MAX_TAGS:
        raise QueryInvalid(f"at most {MAX_TAGS} --tag options")
    lo = parse_day(since, "--since") if since else None
    hi = parse_day(until, "--until") if until else None
    if lo is not None and hi is not None and lo > hi:
        raise QueryInvalid(f"--since {lo.isoformat()} is after --until {hi.isoformat()}: swap them")
    return RecordFilter(
        tuple(dict.fromkeys(kinds)), tuple(dict.fromkeys(categories)), tuple(dict.fromkeys(clean_tags)), lo, hi
    )


__all__ = ["FILTER_KINDS", "RecordFilter", "make_filter", "parse_day", "record_day"]
