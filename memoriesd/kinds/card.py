"""Knowledge cards: files imported or watched (``rag ingest``, ``rag watch``), kind ``card``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from ..text.files import front_matter_end
from ..vault.records import Record
from .base import PlainKind

KIND = "card"


@dataclass(frozen=True)
class CardKind(PlainKind):
    """A card is indexed after its front matter (whose values are searchable as metadata), and is
    embedded without a title when its title is only its file name (``notes/d000123.md``)."""

    name: str = KIND

    def body_start(self, rec: Record) -> int:
        # Fragment offsets still count from the body's first byte: the body keeps the file's text.
        return front_matter_end(rec.body)

    def embed_title(self, title: str, source: str | None) -> str | None:
        if not title or (source and PurePath(source).stem == title):
            return None
        return title


__all__ = ["KIND", "CardKind"]
