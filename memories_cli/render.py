"""How results and summaries look on a terminal (the `text` format): the one place for it.

A search result is a block: its label, score and title on one line, then where it is
(``~/notes/garden.md:12``, or the record id of a note without a file), then a snippet of a few
lines around the best match, the query's words highlighted, wrapped to the terminal's width::

    [S1] 87%  Garden soil notes
        ~/notes/garden.md:12
        …the soil in the raised beds needs compost every spring; test the pH
        before planting…

Ids, revisions, fingerprints and byte ranges are added with ``--verbose``. Colour and bold go to
a terminal only: never into a pipe, never with ``NO_COLOR`` set, unless ``--color always``. Every
piece of user data passes :func:`memories_cli.state.safe_text` before any style is added, so a
title can never drive the terminal. Nothing heavy is imported here (start-up time): ``rich.cells``
only when non-ASCII text is measured.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .state import safe_text, use_color

#: Width when stdout is not a terminal and COLUMNS is unset.
PIPED_COLUMNS = 100
#: Lines of snippet under a result.
SNIPPET_LINES = 3
#: Indent of a result's detail lines.
INDENT = "    "

_STOP = frozenset(
    "a an and are as at be by can de did do does for from had has have how i in is it its me my no not of on or our "
    "should so that the their them then there these they this to us was we were what when where which who why will "
    "with you your".split()
)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"


@functools.cache
def _cjk_run() -> re.Pattern[str]:
    """A run of CJK characters (compiled on first use: these classes take milliseconds to compile)."""
    return re.compile(f"[{_CJK}]+")


@functools.cache
def _word() -> re.Pattern[str]:
    return re.compile(rf"[^\W{_CJK}]+")


def width() -> int:
    """Terminal cells per line: COLUMNS, else the terminal's, else :data:`PIPED_COLUMNS` (never under 40)."""
    return max(40, shutil.get_terminal_size((PIPED_COLUMNS, 24)).columns)


#: Punctuation our own output adds (…, ·, dashes, quotes): one cell each, like Latin letters.
_NARROW = frozenset("\u2026\u00b7\u2013\u2014\u2018\u2019\u201c\u201d")


def _narrow(text: str) -> bool:
    """Every character takes one cell: ASCII, Latin letters (below U+0300) and :data:`_NARROW`."""
    return text.isascii() or all(ord(c) < 0x300 or c in _NARROW for c in text)


def cells(text: str) -> int:
    """Terminal cells ``text`` takes: one a character for Latin text (no import), else rich's tables
    (wide CJK characters count two; loading them costs a few ms of start-up)."""
    if _narrow(text):
        return len(text)
    from rich.cells import cell_len

    return int(cell_len(text))


@dataclass(frozen=True)
class Style:
    """ANSI styles, or nothing at all when colour is off."""

    color: bool

    def _sgr(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def label(self, text: str) -> str:
        return self._sgr("1;36", text)

    def title(self, text: str) -> str:
        return self._sgr("1", text)

    def score(self, text: str) -> str:
        return self._sgr("32", text)

    def where(self, text: str) -> str:
        return self._sgr("35", text)

    def dim(self, text: str) -> str:
        return self._sgr("2", text)

    def hit(self, text: str) -> str:
        return self._sgr("1;33", text)


def style() -> Style:
    return Style(use_color())


# ------------------------------------------------------------------------------ text


def cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` cells, cut with "…" when longer (wide CJK characters count two)."""
    if cells(text) <= room:
        return text
    if _narrow(text):
        return text[: max(0, room - 1)].rstrip() + "\u2026"
    from rich.cells import set_cell_size

    return str(set_cell_size(text, max(0, room - 1))).rstrip() + "\u2026"


def wrap(text: str, room: int) -> list[str]:
    """``text`` (one paragraph) in lines of at most ``room`` cells: at spaces, and inside a word only
    when it is longer than a line or a run of CJK characters (which has no spaces between words)."""
    lines: list[str] = []
    cur, used = "", 0
    for word in text.split():
        w = cells(word)
        gap = 1 if cur else 0
        if used + gap + w <= room:
            cur, used = cur + " " * gap + word, used + gap + w
            continue
        if w > room or (not _narrow(word) and _cjk_run().search(word)):  # Latin: no CJK pattern compiled
            if cur and used + 2 <= room:  # go on on this line
                cur, used = cur + " ", used + 1
            elif cur:
                lines.append(cur)
                cur, used = "", 0
            for ch in word:
                c = cells(ch)
                if used + c > room:
                    lines.append(cur.rstrip())
                    cur, used = "", 0
                cur, used = cur + ch, used + c
            continue
        lines.append(cur)
        cur, used = word, w
    if cur:
        lines.append(cur)
    return lines


def join_wrapped(pieces: Sequence[str], room: int, sep: str = " \u00b7 ") -> list[str]:
    """``pieces`` joined with ``sep`` in lines of at most ``room`` cells, never breaking a piece
    (unless it alone is longer than a line)."""
    lines: list[str] = []
    cur = ""
    for piece in pieces:
        if cur and cells(cur + sep + piece) > room:
            lines.append(cur)
            cur = ""
        cur = cur + sep + piece if cur else piece
    if cur:
        lines.append(cur)
    return [part for line in lines for part in (wrap(line, room) if cells(line) > room else [line])]


# ------------------------------------------------------------------------------ markdown for display

_MD_LINE_DROP = (
    r"^ {0,3}(?:`{3,}|~{3,}).*$"  # a code fence (its code stays)
    r"|^ {0,3}(?:=+|-+|\*(?: *\*){2,}|_(?: *_){2,})[ \t]*$"  # a setext underline or a thematic break
    r"|^ {0,3}\|?(?: *:?-+:? *\|)+ *:?-*:? *\|? *$"  # a table's alignment row
)


@functools.cache
def _md_patterns() -> tuple[re.Pattern[str], ...]:
    return (
        re.compile(_MD_LINE_DROP, re.M),
        re.compile(r"^ {0,3}(?:>[ \t]?)+", re.M),  # blockquote marks
        re.compile(r"^ {0,3}#{1,6}(?:[ \t]+|$)|[ \t]+#+[ \t]*$", re.M),  # ATX heading marks
        re.compile(r"!?\[([^\]\n]*)\](?:\([^)\n]*\)|\[[^\]\n]*\])"),  # [text](url), ![alt](src), [text][ref]
        re.compile(r"<((?:https?|mailto):[^>\s]+)>"),  # <https://...>
        re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1"),  # **strong**, __strong__, ~~struck~~
        re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=\S)\*(?![\w*])|(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?!\w)"),
        re.compile(r"(`+)(.+?)\1"),  # `code`
    )


def plain(text: str) -> str:
    """Markdown shown as the text it renders to: no ``#``/``===``/fence/quote marks, links as their
    text, no emphasis or code marks. Line breaks are kept (a dropped line stays as an empty one), so
    line numbers counted in the result still point into the file. For display only: ``--json`` and
    the machine formats keep the text as stored.

    Not a Markdown parser: markdown-it-py (installed with rich) costs more to import than typer,
    which would undo the CLI's start-up budget on every search (bench/bench_startup.py).
    """
    if not any(ch in text for ch in "#=-`~>[*_<|"):
        return text
    drop, quote, heading, link, auto, strong, emph, code = _md_patterns()
    text = drop.sub("", text)
    text = quote.sub("", text)
    text = heading.sub("", text)
    text = link.sub(r"\1", text)
    text = auto.sub(r"\1", text)
    text = strong.sub(r"\2", text)
    text = emph.sub(lambda m: m.group(1) or m.group(2) or "", text)
    return code.sub(r"\2", text)


def query_terms(query: str) -> list[str]:
    """The words of a query worth highlighting (no stop words; CJK runs as they are and as pairs)."""
    folded = query.casefold()
    latin = _narrow(folded)  # the CJK classes take ~1 ms each to compile: not for a Latin query
    words = re.findall(r"\w+", folded) if latin else _word().findall(folded)
    out = [w for w in words if len(w) > 1 and w not in _STOP]
    for run in () if latin else _cjk_run().findall(folded):
        out.append(run)
        out.extend(run[i : i + 2] for i in range(len(run) - 1) if len(run) > 2)
    return list(dict.fromkeys(out))


def term_pattern(terms: Sequence[str]) -> re.Pattern[str] | None:
    """Matches any term: a latin word and the words it begins (garden, gardens), a CJK run anywhere."""
    if not terms:
        return None
    parts = []
    for t in sorted(terms, key=len, reverse=True):
        parts.append(re.escape(t) if not _narrow(t) and _cjk_run().fullmatch(t) else rf"(?<!\w){re.escape(t)}\w*")
    return re.compile("|".join(parts), re.IGNORECASE)


@dataclass(frozen=True)
class Snippet:
    lines: list[str]
    line_offset: int  # line breaks in the text before the best match


def snippet(text: str, pattern: re.Pattern[str] | None, room: int, max_lines: int = SNIPPET_LINES) -> Snippet:
    """Up to ``max_lines`` wrapped lines of ``text`` around the place that holds the most distinct
    query terms, "…" where the text goes on."""
    budget = room * max_lines
    matches = list(pattern.finditer(text)) if pattern is not None else []
    start = 0
    best_at = 0
    if matches:
        best, best_n = matches[0], 0
        for m in matches:
            window = {x.group().casefold() for x in matches if m.start() <= x.start() < m.start() + budget}
            if len(window) > best_n:
                best, best_n = m, len(window)
        best_at = best.start()
        if len(" ".join(text[:best_at].split())) > budget // 2:  # the match would not show: start before it
            start = max(0, best_at - budget // 5)
            space = re.search(r"\s", text[start:best_at])
            start = start + space.end() if space else start
    flat = " ".join(text[start:].split())
    lines = wrap(("\u2026" if start else "") + flat, room)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = cut(lines[-1] + " \u2026", room)
    return Snippet(lines, text.count("\n", 0, best_at))


def highlight(line: str, pattern: re.Pattern[str] | None, st: Style) -> str:
    if pattern is None or not st.color:
        return line
    return pattern.sub(lambda m: st.hit(m.group()), line)


def home_short(path: str) -> str:
    """An absolute path as text output shows it: under the home directory as ``~/...`` (``--json`` keeps it whole)."""
    home = os.path.expanduser("~").rstrip(os.sep)
    if home and home != "~" and path.startswith(home + os.sep):
        return "~" + path[len(home) :]
    return path


def location(source: str | None, line: int | None) -> str:
    """``~/notes/garden.md:12`` (the line when known)."""
    if not source:
        return ""
    return home_short(source) + (f":{line}" if line else "")


def score_text(r: dict[str, Any]) -> str:
    """A 0-100 relevance where the search mode gives one (``87%``), else the raw score."""
    rel = r.get("relevance")
    if isinstance(rel, (int, float)):
        return f"{int(rel)}%"
    score = r.get("score")
    if not isinstance(score, (int, float)):
        return ""
    x = float(score)
    if 0 < abs(x) < 0.001:
        return "score <0.001"  # never "1e-06" to a person
    return f"score {x:,.0f}" if abs(x) >= 1000 else f"score {x:.3g}"


# ------------------------------------------------------------------------------ blocks


@dataclass(frozen=True)
class Result:
    """What a result block shows, whatever command found it."""

    label: str
    title: str
    score: str = ""
    source: str | None = None
    line: int | None = None
    record: str = ""  # the record id: shown when there is no file, and with --verbose
    text: str = ""  # the passage to take the snippet from ("" = no snippet)
    details: tuple[str, ...] = ()  # --verbose: ids, revisions, fingerprints, byte ranges
    more: str = ""  # one hit per document: "+2 more in this file (lines 40-52, 90)"


def print_results(results: Iterable[Result], query: str, *, verbose: bool = False) -> None:
    """Every result as a block, a blank line between blocks."""
    st = style()
    room = width()
    pattern = term_pattern(query_terms(query))
    out = sys.stdout
    for i, r in enumerate(results):
        if i:
            out.write("\n")
        head = st.label(r.label) + " " + (st.score(r.score) + "  " if r.score else " ")
        head_cells = cells(r.label) + 1 + (cells(r.score) + 2 if r.score else 1)
        out.write(head + st.title(cut(safe_text(plain(r.title)) or "(untitled)", room - head_cells)) + "\n")
        snip = snippet(safe_text(plain(r.text), multiline=True), pattern, room - len(INDENT)) if r.text else None
        line = r.line + snip.line_offset if r.line and snip is not None else r.line
        where = location(r.source, line) if r.source else (f"record {r.record}" if r.record else "")
        if where:
            out.write(INDENT + st.where(cut(safe_text(where), room - len(INDENT))) + "\n")
        if r.more:
            out.write(INDENT + st.dim(cut(safe_text(r.more), room - len(INDENT))) + "\n")
        if verbose and r.details:
            for piece in join_wrapped(r.details, room - len(INDENT)):
                out.write(INDENT + st.dim(piece) + "\n")
        for text_line in snip.lines if snip is not None else []:
            out.write(INDENT + highlight(text_line, pattern, st) + "\n")


def print_summary(title: str, rows: Sequence[tuple[str, str]], hints: Sequence[tuple[str, str]] = ()) -> None:
    """A titled summary: ``Label   value`` rows (values wrapped under themselves), then the next steps."""
    st = style()
    room = width()
    out = sys.stdout
    out.write(st.title(safe_text(title)) + "\n")
    label_cells = max((cells(k) for k, _ in rows), default=0) + 2
    for key, value in rows:
        pad = " " * (label_cells - cells(key))
        lines = wrap(safe_text(value), max(20, room - 2 - label_cells)) or [""]
        out.write("  " + st.dim(key) + pad + lines[0] + "\n")
        for more in lines[1:]:
            out.write("  " + " " * label_cells + more + "\n")
    if hints:
        out.write("\n" + st.title("Next") + "\n")
        for command, why in hints:
            out.write(f"  {st.label(safe_text(command))}\n" + (f"      {st.dim(safe_text(why))}\n" if why else ""))


def percent(used: float, cap: float) -> str:
    """``12%`` of a cap (``<1%`` for a little, never ``0%`` for something)."""
    if cap <= 0:
        return "?"
    share = 100 * used / cap
    return "<1%" if 0 < share < 1 else f"{share:.0f}%"


def mib(n: float) -> str:
    """A size: ``1.2 MiB``, ``34 KiB``, ``512 bytes``."""
    if n >= 104858:
        return f"{n / 1048576:,.1f} MiB"
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n:,.0f} bytes"


__all__ = [
    "Callable",
    "Result",
    "Style",
    "cut",
    "home_short",
    "location",
    "plain",
    "print_results",
    "print_summary",
    "query_terms",
    "score_text",
    "snippet",
    "width",
    "wrap",
]
