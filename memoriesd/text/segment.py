"""Segmentation of text for the lexical index, shared by indexing and queries.

SQLite's FTS5 ``unicode61`` tokenizer splits on anything that is not a letter or
a digit, so Latin-script text needs no help, but a run of Chinese characters is
one "word" to it. We therefore cut Han-script runs with jieba's
``cut_for_search`` (which also emits the sub-words of long words, so 中华 finds
中华人民共和国) and join the pieces with spaces.

Measured by ``bench/measure_segmentation.py`` (numbers in the module docstring
of that script and the lead's report): running jieba only on Han runs and
leaving the rest to FTS5 is several times faster on English text and no worse on
Chinese; jieba applied to everything also breaks accented words apart
(``café`` → ``caf é``). The FTS5 ``porter`` stemmer wrapping ``unicode61``
improves English ranking. Both are the defaults (:data:`DEFAULT`).

jieba keeps a module-global dictionary and, unless told otherwise, caches it in
a predictable file in the system temp directory. :func:`configure` must be
called first with a private directory; :func:`segment` refuses to run before.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import Internal


@dataclass(frozen=True)
class Segmentation:
    """How text is segmented and tokenized for the lexical index.

    ``han_only``: jieba runs only on Han-script runs; other text is passed to
    FTS5 as is. ``porter``: the FTS5 tokenizer is ``porter unicode61`` (English
    stemming) instead of plain ``unicode61``.
    """

    han_only: bool = True
    porter: bool = True

    @property
    def fts5_tokenizer(self) -> str:
        """The ``tokenize=`` argument of the FTS5 table."""
        base = "unicode61 remove_diacritics 2"
        return f"porter {base}" if self.porter else base


#: The configuration the numbers support (see the module docstring).
DEFAULT = Segmentation(han_only=True, porter=True)

# Han script: CJK unified ideographs (incl. extension A), compatibility
# ideographs, and the supplementary ideographic planes (extensions B and up).
_HAN_RUN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]+")
_HAN_CHAR = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]")
# C0/C1 control characters (NUL included) and the Unicode "noncharacter"-ish
# separators FTS5 would otherwise see; they become spaces.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
# One lexical token as FTS5 unicode61 sees it: letters and digits (no "_").
_WORD = re.compile(r"[^\W_]+")

_lock = threading.Lock()
_jieba: ModuleType | None = None
_tmp_dir: Path | None = None


def configure(tmp_dir: Path) -> None:
    """Prepare jieba once: private cache directory, silent logger, loaded dictionary.

    ``tmp_dir`` must be a private directory the caller created (the Memories
    home's ``cache/``). Idempotent and thread-safe; later calls are no-ops,
    because the dictionary is global and already loaded.
    """
    global _jieba, _tmp_dir
    with _lock:
        if _jieba is not None:
            return
        with warnings.catch_warnings():
            # jieba imports pkg_resources and compiles regexes with old escapes.
            warnings.simplefilter("ignore")
            import jieba  # noqa: PLC0415 - imported lazily: 0.2 s and global state

            jieba.setLogLevel(logging.CRITICAL + 1)
            logging.getLogger("jieba").setLevel(logging.CRITICAL + 1)
            jieba.dt.tmp_dir = str(tmp_dir)
            jieba.initialize()
        _jieba = jieba
        _tmp_dir = tmp_dir


def is_configured() -> bool:
    """Whether :func:`configure` has run."""
    return _jieba is not None


def _require_jieba() -> ModuleType:
    jb = _jieba
    if jb is None:
        raise Internal(
            "text segmentation was used before it was configured: call memoriesd.text.segment.configure() "
            "with the private cache directory first"
        )
    return jb


def _cut_han(jb: ModuleType, run: str) -> list[str]:
    return [t for t in jb.cut_for_search(run) if t.strip()]


def segment(text: str, *, han_only: bool = DEFAULT.han_only) -> str:
    """Text segmented for indexing: tokens joined by spaces.

    Han runs are cut with jieba ``cut_for_search``; with ``han_only`` the rest
    is left for FTS5's tokenizer, otherwise jieba sees everything. Control
    characters (NUL included) become spaces.
    """
    jb = _require_jieba()
    text = _CONTROL.sub(" ", text)
    if han_only and text.isascii():  # no Han text possible; far cheaper than the regex on English notes
        return text
    if not han_only:
        return " ".join(t for t in jb.cut_for_search(text) if t.strip())
    if not _HAN_RUN.search(text):
        return text
    return _HAN_RUN.sub(lambda m: " " + " ".join(_cut_han(jb, m.group(0))) + " ", text)


def segment_chars(text: str) -> str:
    """Text for the exact index: every Han character a token of its own.

    Needs no jieba. A Chinese word then matches as a phrase of characters
    wherever it occurs, however jieba would cut its context.
    """
    text = _CONTROL.sub(" ", text)
    if not _HAN_RUN.search(text):
        return text
    return _HAN_CHAR.sub(lambda m: " " + m.group(0) + " ", text)


def has_han(text: str) -> bool:
    """Whether ``text`` contains a Han character."""
    return not text.isascii() and _HAN_RUN.search(text) is not None


def query_terms(text: str, *, han_only: bool = DEFAULT.han_only) -> list[str]:
    """A query cut into lexical terms, in order, with repeats.

    The same segmentation as :func:`segment`, then split into the letter/digit
    runs FTS5 treats as tokens, so every term is a word the index can hold.
    Punctuation, symbols, emoji and control characters are dropped.
    """
    return _WORD.findall(segment(text, han_only=han_only))
