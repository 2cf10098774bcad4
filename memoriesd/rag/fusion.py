"""Hybrid fusion and the light default reranker.

Two fusion functions, chosen by `rag search --fusion` (default convex):

- ``convex`` (the default): each list's scores are min-max normalised over the query's candidates
  (BM25 scores are unbounded, cosines bounded, so raw values cannot be added) and a candidate scores
  ``(bm25_n + w * cos_n) / (1 + w)``, a list it is absent from counting 0. Measured on SciFact and
  XQuAD-zh, it beats RRF with both models because it keeps *how much* better one candidate is than the next,
  which matters when one side (EmbeddingGemma's vectors) is much stronger than the other.
- ``rrf``: reciprocal rank fusion, ``Σ w_i / (k + rank_i)`` over the lists a candidate appears in,
  ``rank`` starting at 1; it looks only at ranks.

``w`` is the vector side's weight, BM25's being 1 (`rag search --vector-weight`, default from the model profile).

The light reranker is a *heuristic*, not a trained cross-encoder: it rewards
candidates whose text covers more of the query's terms and contains adjacent
query terms next to each other (a matched phrase). Its weight is bounded so it
can only reorder candidates whose fused scores are already close — see
:func:`light_rerank` for the exact guarantee.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = [
    "Candidate",
    "FUSIONS",
    "Fused",
    "convex_ranks",
    "fuse",
    "light_rerank",
    "order_by_scores",
    "rrf",
    "rrf_ranks",
    "term_coverage",
]


@dataclass(frozen=True)
class Fused:
    """One fused candidate: its score and the 1-based rank it had in each input (None = absent)."""

    frag_id: int
    score: float
    ranks: tuple[int | None, ...]


@dataclass(frozen=True)
class Candidate:
    """A retrieval candidate as it flows from fusion to reranking to the caller (``--json``).

    ``score`` is the fused score (convex or RRF); ``rerank_score`` is set by a reranker (light or
    remote) and is what the final order follows when present.
    """

    frag_id: int
    score: float
    bm25_rank: int | None = None
    vector_rank: int | None = None
    cosine: float | None = None
    text: str = ""
    title: str = ""
    rerank_score: float | None = None


def _ranks_of(ranking: Sequence[int]) -> dict[int, int]:
    """1-based rank of each id; a repeated id keeps its first (best) rank."""
    out: dict[int, int] = {}
    for pos, frag_id in enumerate(ranking, start=1):
        out.setdefault(frag_id, pos)
    return out


def _fused_order(f: Fused) -> tuple[float, int, int, int]:
    """Score descending; ties by the best single rank, then by the number of lists (more first), then by id."""
    present = [r for r in f.ranks if r is not None]
    return (-f.score, min(present), -len(present), f.frag_id)


def rrf_ranks(rankings: Sequence[Sequence[int]], k: int = 60, weights: Sequence[float] | None = None) -> list[Fused]:
    """Reciprocal rank fusion keeping each candidate's rank in every input.

    ``weights`` (one per ranking, default all 1) make it *weighted* RRF: a candidate scores
    ``Σ w_i / (k + rank_i)``, so a much stronger ranking (a good embedding model beside BM25) is
    not outvoted by a weaker one.

    Order: score descending; ties broken by the best single rank (ascending), then
    by the number of lists the candidate appears in (more first), then by id — so
    the result never depends on dict or set iteration order.
    """
    if k < 1:
        raise ValueError("rrf k must be at least 1")
    w = list(weights) if weights is not None else [1.0] * len(rankings)
    if len(w) != len(rankings) or any(not math.isfinite(x) or x < 0 for x in w):
        raise ValueError("one finite, non-negative weight per ranking")
    per_list = [_ranks_of(r) for r in rankings]
    ids: set[int] = set()
    for ranks in per_list:
        ids.update(ranks)
    fused: list[Fused] = []
    for frag_id in ids:
        ranks_t = tuple(ranks.get(frag_id) for ranks in per_list)
        # Sum from the best rank down so the float result does not depend on list order.
        parts = sorted(wi / (k + r) for wi, r in zip(w, ranks_t, strict=True) if r is not None)
        fused.append(Fused(frag_id, math.fsum(parts), ranks_t))

    fused.sort(key=_fused_order)
    return fused


def _minmax(scored: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Scores mapped onto [0, 1] by the list's own minimum and maximum (all 1 when they are equal)."""
    if not scored:
        return {}
    values = [v for _, v in scored]
    lo, hi = min(values), max(values)
    span = hi - lo
    out: dict[int, float] = {}
    for frag_id, v in scored:
        out.setdefault(frag_id, (v - lo) / span if span > 0 else 1.0)
    return out


def convex_ranks(
    bm25: Sequence[tuple[int, float]], vector: Sequence[tuple[int, float]], weight: float = 1.0
) -> list[Fused]:
    """Convex combination of min-max normalised scores: ``(bm25_n + weight * cos_n) / (1 + weight)``.

    ``bm25`` and ``vector`` are ``(frag_id, score)`` lists, best first (higher is better). The
    result is in [0, 1]; the order and tie-breaks are those of :func:`rrf_ranks`.
    """
    if not math.isfinite(weight) or weight < 0:
        raise ValueError("the vector weight must be finite and non-negative")
    nb, nv = _minmax(bm25), _minmax(vector)
    rb, rv = _ranks_of([f for f, _ in bm25]), _ranks_of([f for f, _ in vector])
    fused = [
        Fused(frag_id, (nb.get(frag_id, 0.0) + weight * nv.get(frag_id, 0.0)) / (1.0 + weight), (rb.get(frag_id), rv.get(frag_id)))
        for frag_id in set(nb) | set(nv)
    ]

    fused.sort(key=_fused_order)
    return fused


#: The fusion functions `rag search --fusion` may name.
FUSIONS = ("convex", "rrf")


def rrf(rankings: Sequence[Sequence[int]], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: ``[(frag_id, score), ...]`` best first (see :func:`rrf_ranks`)."""
    return [(f.frag_id, f.score) for f in rrf_ranks(rankings, k)]


def fuse(
    bm25_ids: Sequence[int],
    vector_ids: Sequence[int],
    *,
    k: int = 60,
    cosines: Mapping[int, float] | None = None,
    texts: Mapping[int, str] | None = None,
    titles: Mapping[int, str] | None = None,
    limit: int | None = None,
    vector_weight: float = 1.0,
    method: str = "rrf",
    bm25_scores: Mapping[int, float] | None = None,
) -> list[Candidate]:
    """Fuse a BM25 and a vector ranking into :class:`Candidate` records (best first).

    ``method``: ``"rrf"`` (ranks, ``k``) or ``"convex"`` (``bm25_scores`` and ``cosines`` of the
    ranked ids); ``vector_weight``: the vector side's weight (BM25's is 1).
    """
    cos = cosines or {}
    txt = texts or {}
    ttl = titles or {}
    out: list[Candidate] = []
    if method == "convex":
        bms = bm25_scores or {}
        fused = convex_ranks(
            [(f, bms.get(f, 0.0)) for f in bm25_ids], [(f, cos.get(f, 0.0)) for f in vector_ids], vector_weight
        )
    elif method == "rrf":
        fused = rrf_ranks([bm25_ids, vector_ids], k, weights=(1.0, vector_weight))
    else:
        raise ValueError(f"unknown fusion {method!r}: use one of {', '.join(FUSIONS)}")
    for f in fused:
        out.append(
            Candidate(
                frag_id=f.frag_id,
                score=f.score,
                bm25_rank=f.ranks[0],
                vector_rank=f.ranks[1],
                cosine=cos.get(f.frag_id),
                text=txt.get(f.frag_id, ""),
                title=ttl.get(f.frag_id, ""),
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


# ---------------------------------------------------------------------------
# Light reranker
# ---------------------------------------------------------------------------

_ASCII_WORD = re.compile(r"[0-9a-z]+")
# Between two adjacent query terms we accept nothing (CJK, compounds) or a short run
# of separators ("local-first", "local first", "local / first").
_GAP = r"[\s\-_/.,:;'\"()]{0,3}"


def _term_pattern(term: str) -> str:
    """Regex for one casefolded query term.

    ASCII words must sit on word boundaries and may carry a common English suffix
    (BM25 stems with porter, so "run" should also credit "runs" and "running"); other terms
    (CJK words from jieba) match as plain substrings, since CJK text has no spaces.
    """
    esc = re.escape(term)
    if _ASCII_WORD.fullmatch(term):
        last = re.escape(term[-1])
        return rf"(?<![0-9a-z]){esc}(?:s|es|{last}?(?:ed|ing|er))?(?![0-9a-z])"
    return esc


def _clean_terms(query_terms: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for t in query_terms:
        t = t.casefold().strip()
        if not t or not any(ch.isalnum() for ch in t) or t in seen:
            continue
        seen.add(t)
        out.append(t)
    return out


_GAP_FULL = re.compile(_GAP + r"\Z")


def _variants(term: str) -> frozenset[str]:
    """The words an ASCII term matches: itself plus the suffixes of :func:`_term_pattern`."""
    last = term[-1]
    return frozenset(
        [term, term + "s", term + "es"] + [term + mid + suf for mid in ("", last) for suf in ("ed", "ing", "er")]
    )


class _Matcher:
    """Term and adjacent-pair matching for one query (built once per rerank).

    ASCII terms are matched against the text's words (maximal ``[0-9a-z]`` runs, the same
    boundaries as the regex), which is one pass per candidate instead of one regex per term;
    other terms (CJK) use their regex.
    """

    def __init__(self, query_terms: Sequence[str]) -> None:
        terms = _clean_terms(query_terms)
        self.n = len(terms)
        self.ascii = [bool(_ASCII_WORD.fullmatch(t)) for t in terms]
        self.variants = [_variants(t) if a else frozenset() for t, a in zip(terms, self.ascii, strict=True)]
        self.terms = [None if a else re.compile(_term_pattern(t)) for t, a in zip(terms, self.ascii, strict=True)]
        # Pair regexes only where a CJK term is involved (ASCII pairs use word positions).
        self.pairs = [
            None if (ia and ib) else re.compile(_term_pattern(a) + _GAP + _term_pattern(b))
            for a, b, ia, ib in zip(terms, terms[1:], self.ascii, self.ascii[1:], strict=False)
        ]

    def score(self, text: str) -> tuple[float, float]:
        if not self.n:
            return 0.0, 0.0
        hay = text.casefold()
        words = set(_ASCII_WORD.findall(hay)) if any(self.ascii) else set()
        spans: list[tuple[str, int, int]] = []
        at: dict[str, list[int]] = {}
        found = [
            bool(words & self.variants[i]) if self.ascii[i] else self.terms[i].search(hay) is not None  # type: ignore[union-attr]
            for i in range(self.n)
        ]
        coverage = sum(found) / self.n
        if self.n < 2:
            return coverage, coverage
        hits = 0
        for i in range(self.n - 1):
            if not (found[i] and found[i + 1]):
                continue
            if self.ascii[i] and self.ascii[i + 1]:
                if not spans:  # word positions, computed only when a pair needs them
                    spans = [(m.group(), m.start(), m.end()) for m in _ASCII_WORD.finditer(hay)]
                    for j, (w, _, _) in enumerate(spans):
                        at.setdefault(w, []).append(j)
                va, vb = self.variants[i], self.variants[i + 1]
                if any(
                    j + 1 < len(spans) and spans[j + 1][0] in vb and _GAP_FULL.match(hay, spans[j][2], spans[j + 1][1])
                    for w in va & words
                    for j in at[w]
                ):
                    hits += 1
            elif self.pairs[i].search(hay) is not None:  # type: ignore[union-attr]
                hits += 1
        return coverage, hits / (self.n - 1)


def term_coverage(query_terms: Sequence[str], text: str) -> tuple[float, float]:
    """``(coverage, phrase)`` of ``text`` for the query, each in [0, 1].

    coverage: share of distinct query terms found in the text. phrase: share of
    adjacent query-term pairs (in query order) found next to each other. With fewer
    than two terms, phrase equals coverage (a one-word query is its own phrase).
    """
    return _Matcher(query_terms).score(text)


def light_rerank(
    query_terms: list[str],
    candidates: list[Candidate],
    *,
    weight: float = 0.15,
    phrase_share: float = 0.35,
) -> list[Candidate]:
    """Reorder fused candidates by query-term coverage and matched phrases (a heuristic).

    Each candidate gets ``rerank_score = score * (1 + weight * bonus) / (1 + weight)``
    where ``bonus = (1 - phrase_share) * coverage + phrase_share * phrase`` is in [0, 1].
    The fused score is not rescaled to the query's best (that printed 1.0 for the nearest of
    candidates that match nothing): with the convex fusion the result stays in [0, 1] and reaches 1
    only for a candidate first on both sides that holds every query term as a phrase.
    Since the bonus multiplies the fused score by at most ``1 + weight``,
    candidate B can pass candidate A only when ``score_B > score_A / (1 + weight)``:
    with RRF at k = 60 and equal weights, a fragment ranked first by both lists cannot be
    passed by one ranked worse than 10th in both, nor by one found by only one list; with
    the convex fusion, a candidate at 1.0 cannot be passed by one below 0.87.
    Candidates are only reordered, never added or dropped; ties keep the fused order.
    """
    if not candidates:
        return []
    if weight < 0 or not 0 <= phrase_share <= 1:
        raise ValueError("light_rerank needs weight >= 0 and 0 <= phrase_share <= 1")
    matcher = _Matcher(query_terms)
    scored: list[tuple[float, int, Candidate]] = []
    for pos, c in enumerate(candidates):
        coverage, phrase = matcher.score(c.title + "\n" + c.text if c.title else c.text)
        bonus = (1.0 - phrase_share) * coverage + phrase_share * phrase
        value = c.score * (1.0 + weight * bonus) / (1.0 + weight)
        scored.append((value, pos, replace(c, rerank_score=value)))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [c for _, _, c in scored]


def order_by_scores(candidates: Sequence[Candidate], scores: Sequence[float]) -> list[Candidate]:
    """Apply reranker scores aligned with ``candidates``: best first, ties keep the fused order."""
    if len(scores) != len(candidates):
        raise ValueError("one score per candidate is required")
    paired = [(s, pos, replace(c, rerank_score=float(s))) for pos, (c, s) in enumerate(zip(candidates, scores, strict=True))]
    paired.sort(key=lambda item: (-item[0], item[1]))
    return [c for _, _, c in paired]
