"""Cutting record bodies into overlapping fragments, the unit of search.

A fragment is at most ``max_chars`` Unicode characters (code points). Cuts fall,
in order of preference, after a sentence or line end in the back half of the
window (。！？； and line breaks; ``.``/``!``/``?`` followed by white space),
after white space or a comma, or else exactly at the window's end. The next
fragment starts ``overlap`` characters before the cut, moved forward (by at most
32 characters) to the start of a word, so consecutive fragments normally share
96–128 characters.

Offsets are BYTE offsets into ``body.encode("utf-8")`` so that the vault can
point into the stored text without decoding it:
``body.encode()[f.start:f.end].decode() == f.text`` always holds. Fragments never
begin or end with white space.

The fingerprint is an HMAC-SHA256 under a per-vault key over the fragment's byte
range and bytes: stable across runs and machines (it depends only on the key,
the position and the text) and, without the key, says nothing about the text.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from ..errors import InvalidParams

#: Hex characters kept of the HMAC (128 bits).
FINGERPRINT_HEX = 32
#: How far the start of an overlap may move forward to reach a word start.
_ALIGN_WINDOW = 32

# Strong breaks: the position right after a sentence end or a line break.
# Closing quotes/brackets stay with their sentence.
_STRONG = re.compile(r"""(?:[。！？；]|[.!?](?=["'”’)\]]*\s))["'”’)\]」』）]*|\n""")
# Weak breaks: after white space or a comma-like mark.
_WEAK = re.compile(r"[\s，、,;:：]")
# A word start inside the alignment window: after white space or punctuation.
_WORD_START = re.compile(r"""[\s，。、；：！？,.;:!?"'“”‘’()\[\]（）「」]+(?=\S)""")
_HAN = re.compile("[\u3400-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]")


@dataclass(frozen=True)
class Fragment:
    """One searchable piece of a record revision's body."""

    record_id: str
    revision: int
    ordinal: int
    start: int  # byte offset into body.encode("utf-8"), inclusive
    end: int  # byte offset, exclusive
    text: str
    fingerprint: str


def fingerprint(key: bytes, start: int, end: int, data: bytes) -> str:
    """HMAC-SHA256 over ``start:end:`` and the fragment's UTF-8 bytes, hex, truncated."""
    return hmac.digest(key, f"{start}:{end}:".encode("ascii") + data, "sha256").hex()[:FINGERPRINT_HEX]


def _last_match_end(pattern: re.Pattern[str], body: str, lo: int, hi: int) -> int | None:
    """End of the last match of ``pattern`` scanning ``body[lo:hi]``.

    Every match of the break patterns starts at a break character and cannot swallow a later one,
    so the matches at or after any position are the same whether the scan starts there or at
    ``lo``: the last 64 characters are tried first, the whole range only when they hold none.
    """
    for start in (max(lo, hi - 64), lo):
        last: int | None = None
        for m in pattern.finditer(body, start, hi):
            last = m.end()
        if last is not None or start == lo:
            return last
    return None  # pragma: no cover - the loop always returns


def _last_break(body: str, lo: int, hi: int) -> int | None:
    """The last cut position in ``(lo, hi]``: strong breaks first, then weak ones."""
    last = _last_match_end(_STRONG, body, lo, hi)
    if last is not None and last > lo:
        return last
    last = _last_match_end(_WEAK, body, lo, hi)
    if last is not None and last > lo:
        return last
    return None


def _align_start(body: str, target: int, limit: int) -> int:
    """Move an overlap start forward to a word start (at most ``_ALIGN_WINDOW``)."""
    if target <= 0:
        return 0
    prev, cur = body[target - 1], body[target]
    if prev.isspace() or _HAN.match(cur) or _HAN.match(prev) or not (prev.isalnum() and cur.isalnum()):
        return target
    m = _WORD_START.search(body, target, min(limit, target + _ALIGN_WINDOW))
    return m.end() if m else target


def _spans(body: str, max_chars: int, overlap: int, skip: int = 0) -> list[tuple[int, int]]:
    """Character spans ``[s, e)`` of the fragments from character ``skip`` on, stripped of white space."""
    n = len(body)
    spans: list[tuple[int, int]] = []
    s = skip
    while True:
        while s < n and body[s].isspace():
            s += 1
        if s >= n:
            break
        if n - s <= max_chars:
            e = n
        else:
            hi = s + max_chars
            cut = _last_break(body, s + max_chars // 2, hi)
            e = cut if cut is not None else hi
        ce = e
        while ce > s and body[ce - 1].isspace():
            ce -= 1
        if ce > s:
            spans.append((s, ce))
        if e >= n:
            break
        nxt = _align_start(body, max(e - overlap, s + 1), e)
        s = nxt if nxt > s else e
    return spans


def _byte_offsets(body: str, positions: list[int]) -> dict[int, int]:
    """Byte offset of each character position (one pass over the sorted positions)."""
    out: dict[int, int] = {}
    prev = 0
    acc = 0
    for p in sorted(set(positions)):
        acc += len(body[prev:p].encode("utf-8"))
        out[p] = acc
        prev = p
    return out


def split_fragments(
    record_id: str,
    revision: int,
    body: str,
    fingerprint_key: bytes,
    *,
    max_chars: int = 768,
    overlap: int = 128,
    skip: int = 0,
) -> list[Fragment]:
    """Cut ``body`` into fragments of at most ``max_chars`` characters (see the module docstring).

    An empty or all-white-space body has no fragments. ``skip``: the number of leading characters
    left out (a card's front matter); offsets still count from the body's first byte.
    """
    if max_chars < 16 or not (0 <= overlap < max_chars // 2):
        raise InvalidParams(
            f"fragment size {max_chars} with overlap {overlap} is invalid: use at least 16 characters "
            "and an overlap under half the size"
        )
    try:
        data = body.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParams(
            "the text contains invalid Unicode (an unpaired surrogate): send it as valid UTF-8"
        ) from None
    spans = _spans(body, max_chars, overlap, min(max(skip, 0), len(body)))
    if not spans:
        return []
    if len(data) == len(body):  # ASCII: characters are bytes
        offsets = None
    else:
        offsets = _byte_offsets(body, [p for span in spans for p in span])
    frags: list[Fragment] = []
    for ordinal, (s, e) in enumerate(spans):
        bs, be = (s, e) if offsets is None else (offsets[s], offsets[e])
        frags.append(
            Fragment(
                record_id=record_id,
                revision=revision,
                ordinal=ordinal,
                start=bs,
                end=be,
                text=body[s:e],
                fingerprint=fingerprint(fingerprint_key, bs, be, data[bs:be]),
            )
        )
    return frags
