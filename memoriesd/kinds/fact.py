"""Facts the assistant remembers (``memory remember``, extraction), kind ``fact``: each has one of
:data:`CATEGORIES`, which ``--category`` selects. The rest of facts is in :mod:`memoriesd.memory.facts`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from ..vault.records import Record
from .base import PlainKind

KIND = "fact"
CATEGORIES = ("profile", "preference", "decision", "pattern", "fact")


def category_of(rec: Record) -> str:
    return str(rec.meta.get("category") or "fact")


@dataclass(frozen=True)
class FactKind(PlainKind):
    """A fact has a category and no day of its own but its creation (no front matter is read)."""

    name: str = KIND
    categories: tuple[str, ...] = CATEGORIES

    def own_day(self, rec: Record) -> date | None:
        return None

    def category(self, rec: Record) -> str | None:
        return category_of(rec)


__all__ = ["CATEGORIES", "KIND", "FactKind", "category_of"]
