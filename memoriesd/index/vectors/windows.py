"""Windows: extra vectors that let a fragment be found by the part of it that answers.

A record kind may give each fragment windows (:meth:`memoriesd.kinds.base.RecordKind.windows`); this
module keys them in the vector index and scores a fragment with them. Conversations have them
(:func:`memoriesd.kinds.turns.turn_windows`): a conversation fragment groups up to a dozen turns. Its one vector averages
them all, so a question answered by one exchange inside it ("when did Melanie sign up for the
pottery class?") scores it lower than the exchange alone would. Besides that vector, each
fragment of three or more whole turns gets one vector per *window* of two
consecutive turns (a question and its answer, usually), embedded with the same title. A
fragment's vector score is then its own cosine lifted halfway to its best window's when that is
higher (:func:`combine`): the whole still counts, so a fragment is not ranked on one stray line,
the exchange that answers lifts it, and a fragment whose meaning is spread over many turns (no
window alone as close as the whole) keeps its own score.

The lifted score is what the answering surfaces rank by (``rag context``, ``rag ask``:
``SearchRequest.windows``), where a budget of a few items wants the passage that answers first;
``rag search`` ranks by each fragment's own vector, since ten results that cover the most turns
serve a reader (and multi-hop questions) better: measured both ways (docs/memory.md, "Conversations").

Windows are not search results and not lexical fragments: they live in the vector index only,
under negative keys derived from their fragment's id (:func:`window_id`), and leave with it.

Measured on the LoCoMo dev files with EmbeddingGemma (bench/eval_conversations.py; docs/memory.md,
Conversations). Their cost: a fragment of ``n`` turns has ``n - 1`` windows, about twice the
fragment's text in all, so a conversation takes about three times as long to embed as without them.
``[index] conversation_windows = false`` turns them off.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from ...kinds.base import MAX_WINDOWS
from ...kinds.registry import kinds

if TYPE_CHECKING:
    import numpy as np

    from .matrix import VectorIndex


def _per_fragment() -> int:
    """The most windows a fragment of any registered kind has (a conversation's: 11)."""
    return min(MAX_WINDOWS, max((k.max_windows for k in kinds()), default=0))


def window_id(frag_id: int, j: int) -> int:
    """The vector key of window ``j`` of fragment ``frag_id`` (negative: never a fragment's)."""
    if not 0 <= j < MAX_WINDOWS or frag_id < 0:
        raise ValueError("window index out of range")
    return -(frag_id * MAX_WINDOWS + j) - 1


def window_parent(key: int) -> tuple[int, int]:
    """``(fragment id, window index)`` of a window key (:func:`window_id`)."""
    frag_id, j = divmod(-key - 1, MAX_WINDOWS)
    return frag_id, j


def combine(fragment: float | None, best_window: float | None) -> float | None:
    """A fragment's vector score from its own cosine and its best window's: lifted halfway to its
    best window when that is closer, never lowered by it (either alone when the other has no
    vector yet)."""
    if best_window is None:
        return fragment
    if fragment is None:
        return best_window
    return fragment + max(0.0, best_window - fragment) / 2


def search_with_windows(
    index: VectorIndex,
    query: np.ndarray,
    k: int,
    *,
    allowed: Collection[int] | None = None,
    min_score: float | None = None,
    best_windows: dict[int, int] | None = None,
) -> list[tuple[int, float]]:
    """Top ``k`` ``(fragment id, score)`` of a :class:`~memoriesd.index.vectors.matrix.VectorIndex` that
    also holds turn windows: each fragment scored by :func:`combine`, best first (ties by id).

    The candidates are the fragments found, by themselves or by one of their windows, among the
    index's best ``max(4k, k + 256)`` rows; then each candidate's own and window cosines are read
    exactly. ``allowed`` (fragment ids) lets in their windows too; ``min_score`` applies to the
    combined score. ``best_windows``, when given, receives each returned fragment's closest window
    (its index) if it has one: the turns a context pack excerpts."""
    if k <= 0:
        return []
    per = _per_fragment()
    if allowed is not None:
        frags = [f for f in allowed if f >= 0]
        allowed = set(frags)
        allowed.update(w for f in frags for j in range(per) if (w := window_id(f, j)) in index)
        if not allowed:
            return []
    pairs = index.search(query, max(4 * k, k + 256), allowed=allowed)
    parents = list(dict.fromkeys(key if key >= 0 else window_parent(key)[0] for key, _ in pairs))
    if not parents:
        return []
    own = index.score(query, parents)
    wins = [(i, w) for i, f in enumerate(parents) for j in range(per) if (w := window_id(f, j)) in index]
    best: list[float | None] = [None] * len(parents)
    which: list[int] = [-1] * len(parents)
    for (i, w), score in zip(wins, index.score(query, [w for _, w in wins]), strict=True):
        if score is not None and ((b := best[i]) is None or score > b):
            best[i] = score
            which[i] = window_parent(w)[1]
    out: list[tuple[int, float]] = []
    for f, o, b in zip(parents, own, best, strict=True):
        score = combine(o, b)
        if score is not None and (min_score is None or score >= min_score):
            out.append((f, score))
    out.sort(key=lambda p: (-p[1], p[0]))
    out = out[:k]
    if best_windows is not None:
        at = {f: i for i, f in enumerate(parents)}
        best_windows.update((f, which[at[f]]) for f, _ in out if which[at[f]] >= 0)
    return out


__all__ = [
    "combine",
    "search_with_windows",
    "window_id",
    "window_parent",
]
