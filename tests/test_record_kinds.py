"""Record kinds are plug-ins: the index, the embedder's input and the filters ask the kind registry
(memoriesd.kinds.registry), so a new kind is one class and one registration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest

from memoriesd.errors import QueryInvalid
from memoriesd.index.docs import embed_input, index_doc
from memoriesd.kinds.base import PlainKind
from memoriesd.kinds.registry import (
    kind_names,
    kind_of,
    register,
    register_builtin_kinds,
    unregister,
)
from memoriesd.rag.filters import make_filter, record_day
from memoriesd.vault.records import Record

KEY = bytes(32)


@dataclass(frozen=True)
class JournalKind(PlainKind):
    """A journal entry, dated by the ISO day it starts with, of category mood."""

    name: str = "journal"
    categories: tuple[str, ...] = ("mood",)

    def own_day(self, rec: Any) -> date | None:
        return date.fromisoformat(rec.body[:10])

    def category(self, rec: Any) -> str | None:
        return "mood"

    def embed_title(self, title: str, source: str | None) -> str | None:
        return f"journal: {title}"


@pytest.fixture
def journal() -> Iterator[None]:
    register_builtin_kinds()
    register(JournalKind())
    try:
        yield
    finally:
        unregister("journal")


def record(kind: str, body: str, title: str = "t", meta: dict[str, Any] | None = None) -> Record:
    return Record("r1", 1, kind, title, body, False, (), meta=meta or {}, created=0.0, updated=0.0)


def test_the_built_in_kinds_are_registered_in_the_order_kind_lists_them() -> None:
    register_builtin_kinds()
    assert kind_names()[:4] == ("memory", "card", "fact", "conversation")


def test_a_kind_nobody_registered_is_indexed_as_plain_text() -> None:
    doc = index_doc(record("scribble", "---\ndate: 2024-01-02\n---\nhello"), KEY)
    assert [f.text for f in doc.fragments] == ["---\ndate: 2024-01-02\n---\nhello"]  # no front matter skip
    assert kind_of("scribble").categories == ()


def test_a_registered_kind_decides_its_day_title_category_and_filter_options(journal: None) -> None:
    rec = record("journal", "2024-03-05 a calm day")
    assert record_day(rec) == date(2024, 3, 5)
    doc = index_doc(rec, KEY)
    assert embed_input(doc, doc.fragments[0]) == ("journal: t", "2024-03-05 a calm day")
    keep = make_filter(["journal"], ["mood"], [], None, None)
    assert keep.keeps(rec)
    assert not keep.keeps(record("memory", "x"))
    with pytest.raises(QueryInvalid, match="--category selects facts or journals"):
        make_filter(["card"], ["mood"], [], None, None)


def test_a_card_titled_by_its_file_name_is_embedded_without_a_title() -> None:
    rec = record("card", "---\ntags: [x]\n---\nbuy milk", title="todo", meta={"source": "/n/todo.md"})
    doc = index_doc(rec, KEY)
    assert doc.fragments[0].text == "buy milk"  # after the front matter
    assert embed_input(doc, doc.fragments[0]) == (None, "buy milk")
