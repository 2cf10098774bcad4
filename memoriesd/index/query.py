"""Turning user text into safe FTS5 MATCH expressions.

User text is never FTS5 syntax. It is cut into lexical terms (letters and
digits only, see :func:`memoriesd.text.segment.query_terms`), and every term is
written as a double-quoted FTS5 string, so quotes, ``*``, ``^``, ``:``,
``NEAR(``, ``AND``/``OR``/``NOT`` and column filters in the query are searched
as words or dropped as punctuation, never interpreted.

Two indexes answer queries (see :mod:`memoriesd.index.bm25`): the ranked index
holds jieba's word segmentation; the exact index holds Han characters one by
one, so that a Chinese word or phrase matches wherever its characters occur in
sequence, even when jieba cut the surrounding text differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import QueryInvalid
from ..text.segment import DEFAULT, has_han, query_terms, segment_chars

MATCH_MODES = ("any", "all", "phrase")
#: Lexical terms used from one query; the rest are ignored and reported.
MAX_TERMS = 64
#: Longest query accepted, in UTF-8 bytes.
MAX_QUERY_BYTES = 1024

_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class ParsedQuery:
    """A validated query: its terms and the MATCH expressions that implement the mode.

    ``ranked_terms`` (distinct) are OR-ed for BM25 scores in every mode.
    ``constraint`` is the expression a fragment must satisfy in ``all`` and
    ``phrase`` modes (None for ``any``); ``constraint_exact`` says it targets the
    exact index (the query contains Han characters) rather than the ranked one.
    ``exact_any`` (``any`` mode with Chinese words of two or more characters)
    finds those words inside longer words in the exact index; such fragments
    follow the ranked ones with score 0.
    """

    match_mode: str
    terms: tuple[str, ...]
    ignored_terms: int
    ranked_terms: tuple[str, ...]
    constraint: str | None
    constraint_exact: bool
    exact_any: str | None = None

    @property
    def ranked(self) -> str:
        """The OR of all ranked terms."""
        return or_expression(self.ranked_terms)


def quote(term: str) -> str:
    """An FTS5 string literal: double quotes around, inner double quotes doubled."""
    return '"' + term.replace('"', '""') + '"'


def or_expression(terms: Iterable[str]) -> str:
    """``"a" OR "b" ...``: any of the terms."""
    return " OR ".join(quote(t) for t in terms)


def _dedupe(terms: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for t in terms:
        key = t.casefold()
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def parse_query(query: str, match_mode: str = "any", *, han_only: bool = DEFAULT.han_only) -> ParsedQuery:
    """Validate ``query`` and build its MATCH expressions, or raise :class:`QueryInvalid`.

    ``any`` and ``all`` use each distinct term once; ``phrase`` keeps the terms
    in order with repeats. At most :data:`MAX_TERMS` terms are used.
    """
    if match_mode not in MATCH_MODES:
        raise QueryInvalid(f"match mode {match_mode!r} is unknown: use any, all or phrase")
    if not isinstance(query, str):
        raise QueryInvalid("the query must be text: pass the words to search for")
    size = len(query.encode("utf-8", "surrogatepass"))
    if size > MAX_QUERY_BYTES:
        raise QueryInvalid(
            f"the query is {size:,} bytes, over the limit of {MAX_QUERY_BYTES:,} bytes: shorten it"
        )
    # Lone surrogates cannot reach SQLite; they are not letters anyway.
    query = query.encode("utf-8", "replace").decode("utf-8")
    words = _dedupe(query_terms(query, han_only=han_only))
    if not words:
        raise QueryInvalid(
            "the query has no searchable words: use letters or digits (punctuation and symbols are ignored)"
        )
    exact = match_mode != "any" and has_han(query)
    exact_any: str | None = None
    if match_mode == "phrase":
        # The phrase is the query's own token sequence; with Han text, one
        # token per character, matched in the exact index.
        seq = _WORD.findall(segment_chars(query)) if exact else query_terms(query, han_only=han_only)
        ignored = max(0, len(seq) - MAX_TERMS)
        seq = seq[:MAX_TERMS]
        terms = seq
        ranked_terms = words[:MAX_TERMS] if exact else _dedupe(seq)
        constraint: str | None = quote(" ".join(seq))
    else:
        ignored = max(0, len(words) - MAX_TERMS)
        terms = ranked_terms = words[:MAX_TERMS]
        if match_mode == "any":
            constraint = None
            long_han = [t for t in terms if len(t) >= 2 and has_han(t)]
            if long_han:
                exact_any = " OR ".join(quote(segment_chars(t).strip()) for t in long_han)
        elif exact:
            # Each term as a run of single characters: substring semantics for Han.
            constraint = " AND ".join(quote(segment_chars(t).strip()) for t in terms)
        else:
            constraint = " AND ".join(quote(t) for t in terms)
    return ParsedQuery(match_mode, tuple(terms), ignored, tuple(ranked_terms), constraint, exact, exact_any)
