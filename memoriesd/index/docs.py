"""What the lexical index holds per record revision, what the embedder reads of each fragment
(:func:`embed_input`, shared by the vector space and the snapshot keeper), and the cache caps.

Kept apart from :mod:`memoriesd.index.bm25` so that code which only counts or checks documents
never needs the FTS5 index.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from ..config import CacheConfig
from ..errors import CapExceeded
from ..kinds.registry import kind_of
from ..text.fragments import Fragment, fingerprint
from ..vault.records import Record

_MIB = 1024 * 1024


@dataclass(frozen=True)
class IndexedDoc:
    """A record revision as the index sees it."""

    record_id: str
    revision: int
    kind: str
    title: str
    meta_text: str
    source: str | None
    fragments: tuple[Fragment, ...]
    when: str | None = None  # a conversation's session date in words (part of its embedding title)
    # A conversation's turn windows per fragment, aligned with ``fragments`` (vectors only:
    # memoriesd.index.vectors.windows); () for every other record.
    windows: tuple[tuple[Fragment, ...], ...] = ()

    @functools.cached_property
    def source_bytes(self) -> int:
        """UTF-8 bytes of the title, body and metadata text (:func:`doc_source_bytes`), once."""
        body = 0
        covered = 0
        for f in sorted(self.fragments, key=lambda f: f.start):
            lo = max(f.start, covered)
            if f.end > lo:
                body += f.end - lo
                covered = f.end
        return len(self.title.encode("utf-8")) + len(self.meta_text.encode("utf-8")) + body


_H1_LINE = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def embed_input(doc: IndexedDoc, frag: Fragment) -> tuple[str | None, str]:
    """What the embedder reads for a fragment: ``(title or None, text)``.

    - The model card's ``title: none`` when the record has no title of its own: a card whose title
      is only its file name (``notes/d000123.md`` -> ``d000123``) is embedded without a title.
    - The ``# H1`` line that gave the title is not repeated in the first fragment's text (the title
      is already in the prompt; the first fragment of a card with front matter starts after it).
      Stored fragment text and byte offsets stay exact: only the embedder's input changes.
    """
    title = doc.title.strip()
    text = frag.text
    if doc.when:  # a conversation: "who and when" in the title the embedder reads
        return (f"{title} ({doc.when})" if title else doc.when), text
    if not title:
        return None, text
    if frag.ordinal == 0:
        m = _H1_LINE.search(text)
        if m is not None and " ".join(m.group(1).split()) == title:
            rest = text[m.end() :]
            rest = rest[1:] if rest.startswith("\n") else rest
            return title, (text[: m.start()] + rest).strip("\n") or text
    return kind_of(doc.kind).embed_title(title, doc.source), text  # a card titled by its file name: None


META_SKIP = ("sha256",)  # metadata not worth indexing


def meta_text(rec: Record) -> str:
    """Safe metadata as searchable text (tags, front matter values, the source file name)."""
    parts: list[str] = list(rec.tags)
    for key, value in rec.meta.items():
        if key in META_SKIP or key == "source":
            continue
        if isinstance(value, list):
            parts.extend(str(v) for v in value)
        elif isinstance(value, (str, int, float)):
            parts.append(str(value))
    return " ".join(parts)


def index_doc(rec: Record, fp_key: bytes) -> IndexedDoc:
    """A record revision as the index holds it: its fragments, fingerprinted with ``fp_key``
    (the vault's fingerprint subkey), and its searchable title and metadata."""
    frags = kind_of(rec.kind).fragments(rec, fp_key)
    if not frags and rec.title.strip():
        # A title-only record: one empty fragment so its title and metadata are searchable.
        frags = [Fragment(rec.id, rec.revision, 0, 0, 0, "", fingerprint(fp_key, 0, 0, b""))]
    return doc_from_record(rec, tuple(frags))


def doc_from_record(rec: Record, fragments: tuple[Fragment, ...]) -> IndexedDoc:
    """The indexed view of a record revision with the given fragments (from :func:`index_doc`,
    or from a snapshot's byte ranges). ``source``: a card's file by its absolute path (``path``,
    the path under the folder that was ingested, only for a card that has no ``source``)."""
    source = rec.meta.get("source") or rec.meta.get("path") or None
    kind = kind_of(rec.kind)
    values: dict[str, Any] = {
        "record_id": rec.id,
        "revision": rec.revision,
        "kind": rec.kind,
        "title": rec.title,
        "meta_text": meta_text(rec),
        "source": str(source) if source else None,
        "fragments": fragments,
        "when": kind.when(rec),
        "windows": kind.windows(rec, fragments),
    }
    if not _FAST_INIT:
        return IndexedDoc(**values)
    # An unlock's restore makes one per record: without the frozen dataclass's nine __setattr__
    # calls. The same fields and values: equal and hashing alike (as Record.from_entry does).
    doc = _new(IndexedDoc)
    _set(doc, "__dict__", values)
    return doc


_new = object.__new__
_set = object.__setattr__
# doc_from_record fills every field itself: only while that stays true (a field added to
# IndexedDoc falls back to the constructor, with its default).
_FAST_INIT = {f.name for f in fields(IndexedDoc)} == {
    "record_id", "revision", "kind", "title", "meta_text", "source", "fragments", "when", "windows"
}


@dataclass(frozen=True)
class IndexStats:
    """Sizes that the cache caps apply to."""

    fragments: int
    source_bytes: int  # UTF-8 bytes of titles, bodies (once, not per overlap) and metadata text


def doc_source_bytes(doc: IndexedDoc) -> int:
    """UTF-8 bytes of a document's title, body and metadata text.

    The body counts once: the union of its fragments' byte ranges.
    """
    return doc.source_bytes


def index_stats(docs: Iterable[IndexedDoc]) -> IndexStats:
    """Stats of the index ``docs`` would make, without building it (to check caps first)."""
    n = 0
    size = 0
    for d in docs:
        n += len(d.fragments)
        size += doc_source_bytes(d)
    return IndexStats(fragments=n, source_bytes=size)


def check_caps(n_fragments: int, source_bytes: int, cache: CacheConfig) -> None:
    """Raise :class:`CapExceeded` when a vault is over the cache caps of ``[index]``."""
    if n_fragments > cache.max_fragments:
        raise CapExceeded(
            f"this vault has {n_fragments:,} fragments, over the cache cap of {cache.max_fragments:,}: "
            "raise [index] max_fragments in config.toml"
        )
    limit = cache.max_source_mib * _MIB
    if source_bytes > limit:
        raise CapExceeded(
            f"this vault has {source_bytes / _MIB:,.1f} MiB of text, over the cache cap of "
            f"{cache.max_source_mib:g} MiB: raise [index] max_source_mib in config.toml"
        )
