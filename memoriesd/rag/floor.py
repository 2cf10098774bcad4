"""The relevance floor of one vault under one model, calibrated on the vault's own vectors.

Vector search always has nearest neighbours, so a cosine floor decides when a neighbour is no
match (search, ``rag ask``, context packs: :func:`memoriesd.rag.search._floor`). One constant per
model does not hold: how close a meaningless query comes to *some* fragment depends on the vault
as much as on the model. With all-MiniLM-L6-v2 the constant 0.25 let 55 % of random-word queries
through on SciFact and 80 % on tldr's command pages; on code-heavy or Chinese text every query has
neighbours at 0.38–0.40 (a model that cannot read a text maps it close to everything else it cannot read).

**The statistic.** A fixed, deterministic set of *probes* (:func:`probe_texts`) is embedded as
queries are: :data:`N_NONSENSE` nonsense strings (pronounceable and unpronounceable words in Latin
script, random Han, Cyrillic, Hangul and Katakana characters) and :data:`N_EVERYDAY` everyday
questions from domains a notes vault rarely covers. For each probe, its nearest-neighbour cosine
among the vault's vectors is the best a query that means nothing here reaches: the vault's *null
distribution*. The floor is its top:

    floor = max( max(nonsense), median(everyday) + 2 * (q75(everyday) - median(everyday)) )

Nonsense can never be on-topic, so the closest any nonsense probe came is a hard lower bound (none
of them, nor nonsense like them, is a match). An everyday question may be on-topic for some vault
(a cooking vault, a Chinese encyclopedia for a Chinese question), so that group counts only through
a robust upper quantile that a few on-topic probes cannot move. A real query that meets the vault's
content lands above this whatever the model's absolute scale (bench/calibrate_floor.py, docs/search.md).
A vault with fewer than :data:`MIN_VECTORS` vectors has no stable null distribution: the model
profile's constant is used instead.

**When.** The probes' vectors are computed once per model and process (no vault text in them);
the vault's calibration is a matrix product of those ~64 probes with its vectors, done on the
first search that needs it (over at most :data:`FIRST_ROWS` rows, evenly spread, so it stays cheap)
and again in a background thread once the vector count moved by :data:`REFRESH_GROWTH` or the
first one was cut short. It lives in memory only, with the vault's process.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..index.vectors.space import VectorSpace
    from .vector_view import VectorView

log = logging.getLogger("memoriesd.rag")

#: Fewer vectors than this: no calibration (the profile's floor applies).
MIN_VECTORS = 32
#: The first, synchronous calibration reads at most this many rows (spread evenly).
FIRST_ROWS = 20_000
#: Recalibrate (in the background) once the vector count grew or shrank by this share.
REFRESH_GROWTH = 0.25
#: How far past the everyday probes' median the floor goes, in units of their (q75 - median).
SPREAD = 2.0
#: The probes: nonsense first, then everyday questions (see :func:`probe_texts`).
N_NONSENSE = 44
N_EVERYDAY = 20
#: No calibrated floor is taken above this (a vault whose every fragment looks alike to the model
#: would otherwise answer nothing by meaning; BM25 still answers by words).
CEILING = 0.95

_SEED = 29_2026
_EVERYDAY = (
    "how long should I boil an egg for a runny yolk",
    "best time of year to plant tulip bulbs",
    "who painted the ceiling of the sistine chapel",
    "cheap flights to lisbon in may",
    "how to knit a scarf for beginners",
    "what is the capital of mongolia",
    "lyrics of a famous christmas song",
    "how many calories are in a banana",
    "final score of the world cup in 1998",
    "how do I get red wine out of a carpet",
    "recipe for sourdough bread with rye flour",
    "when do swallows migrate south",
    "rules of cricket explained simply",
    "the plot of a romantic comedy film",
    "how tall is the eiffel tower",
    "horoscope for taurus this week",
    "如何煮一碗好吃的牛肉面",
    "明天北京的天气怎么样",
    "как приготовить борщ",
    "今日の東京の天気",
)


def probe_texts() -> list[str]:
    """The probes, the same in every process and release: nonsense words in several scripts and
    everyday questions (the module docstring says what they are for)."""
    rng = random.Random(_SEED)
    consonants, vowels = "bcdfghjklmnprstvwxz", "aeiou"
    out: list[str] = []
    for _ in range(20):  # pronounceable nonsense: "zorvik plenthu"
        words = [
            "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        out.append(" ".join(words))
    for _ in range(8):  # letter soup: "xqzvk wtrpl"
        out.append(
            " ".join(
                "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(rng.randint(4, 9)))
                for _ in range(rng.randint(1, 2))
            )
        )
    for lo, hi, n in ((0x4E00, 0x9FA5, 8), (0x0430, 0x044F, 3), (0xAC00, 0xD7A3, 3), (0x30A1, 0x30F6, 2)):
        for _ in range(n):  # random characters of one script: Han, Cyrillic, Hangul, Katakana
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(3, 8))))
    out.extend(_EVERYDAY)
    return out


@dataclass(frozen=True)
class Calibration:
    """One vault's calibrated floor: ``floor`` from the probes' nearest-neighbour cosines among
    ``vectors`` vectors (``rows`` of them read): the nonsense probes' maximum and the everyday
    probes' median and third quartile."""

    floor: float
    vectors: int
    rows: int
    nonsense_max: float
    everyday_q50: float
    everyday_q75: float

    @property
    def complete(self) -> bool:
        return self.rows >= self.vectors

    def as_dict(self) -> dict[str, Any]:
        return {
            "floor": round(self.floor, 4),
            "vectors": self.vectors,
            "rows": self.rows,
            "nonsense_max": round(self.nonsense_max, 4),
            "everyday_q50": round(self.everyday_q50, 4),
            "everyday_q75": round(self.everyday_q75, 4),
        }


def nearest(probes: np.ndarray, rows: np.ndarray, block: int = 8192) -> np.ndarray:
    """Each probe's best cosine among ``rows`` (unit float32 vectors), computed in row blocks."""
    best = np.full(probes.shape[0], -1.0, dtype=np.float32)
    for start in range(0, rows.shape[0], block):
        part = np.asarray(rows[start : start + block], dtype=np.float32)
        np.maximum(best, (part @ probes.T).max(axis=0), out=best)
    return best


def floor_of(best: np.ndarray, rows: int, total: int) -> Calibration:
    """The calibration from the probes' nearest-neighbour cosines ``best`` (in :func:`probe_texts` order)."""
    nonsense, everyday = best[:N_NONSENSE], best[N_NONSENSE : N_NONSENSE + N_EVERYDAY]
    top = float(nonsense.max())
    q50, q75 = (float(v) for v in np.quantile(everyday, [0.5, 0.75]))
    floor = min(CEILING, max(top, q50 + SPREAD * (q75 - q50)) + 1e-4)
    return Calibration(floor, total, rows, top, q50, q75)


def calibrate(probes: np.ndarray, rows: np.ndarray, *, vectors: int | None = None) -> Calibration:
    """The floor of a vault whose vectors are ``rows`` (or a sample of its ``vectors`` vectors)."""
    n = int(rows.shape[0])
    return floor_of(nearest(probes, rows), n, vectors if vectors is not None else n)


#: Scores the vault's vectors: ``nearest_fn(probes, limit)`` gives each probe's best cosine among at
#: most ``limit`` of them (evenly spread; None: all), the rows read and the vault's vector count.
Nearest = Callable[[np.ndarray, int | None], tuple[np.ndarray, int, int]]


@dataclass
class _Entry:
    calibration: Calibration | None = None
    refreshing: bool = False


@dataclass
class FloorKeeper:
    """The calibrated floors of the vaults this process serves, in memory (one per vault and model)."""

    _probes: dict[str, np.ndarray] = field(default_factory=dict)
    _entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def probes(self, identity: str, embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """The probes' vectors under the model ``identity`` (embedded once per process)."""
        with self._lock:
            got = self._probes.get(identity)
        if got is None:
            got = np.ascontiguousarray(np.asarray(embed(probe_texts()), dtype=np.float32))
            with self._lock:
                self._probes[identity] = got
        return got

    def floor(
        self, vault_id: str, identity: str, count: int, probes: np.ndarray, nearest_fn: Nearest
    ) -> Calibration | None:
        """The vault's calibration for ``count`` vectors now: computed on first use (over at most
        :data:`FIRST_ROWS` rows), refreshed in the background when stale; None under :data:`MIN_VECTORS`."""
        if count < MIN_VECTORS:
            return None
        key = (vault_id, identity)
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            cal = entry.calibration
        if cal is None:
            best, rows, total = nearest_fn(probes, FIRST_ROWS)
            if rows < MIN_VECTORS:
                return None
            cal = _calibration(best, rows, total)
            with self._lock:
                entry.calibration = cal
            log.info(
                "relevance floor calibrated: %.3f over %d of %d vectors", cal.floor, cal.rows, cal.vectors
            )
        with self._lock:
            stale = not cal.complete or abs(count - cal.vectors) > REFRESH_GROWTH * cal.vectors
            start = stale and not entry.refreshing
            if start:
                entry.refreshing = True
        if start:
            threading.Thread(
                target=self._refresh,
                args=(key, entry, probes, nearest_fn),
                name="memoriesd-floor",
                daemon=True,
            ).start()
        return cal

    def _refresh(self, key: tuple[str, str], entry: _Entry, probes: np.ndarray, nearest_fn: Nearest) -> None:
        try:
            best, rows, total = nearest_fn(probes, None)
            if rows >= MIN_VECTORS:
                cal = _calibration(best, rows, total)
                with self._lock:
                    if self._entries.get(key) is entry:
                        entry.calibration = cal
                log.info("relevance floor recalibrated: %.3f over %d vectors", cal.floor, cal.vectors)
        except (ValueError, RuntimeError, MemoryError) as exc:  # the last calibration stays
            log.warning("relevance floor recalibration failed: %s", type(exc).__name__)
        finally:
            with self._lock:
                entry.refreshing = False

    def calibration(self, vault_id: str, identity: str) -> Calibration | None:
        """The vault's last calibration under ``identity`` (None: none yet); computes nothing."""
        with self._lock:
            entry = self._entries.get((vault_id, identity))
            return entry.calibration if entry is not None else None

    def forget_vault(self, vault_id: str) -> None:
        """Drop a vault's calibrations (it locked)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == vault_id]:
                del self._entries[key]


def _calibration(best: np.ndarray, rows: int, total: int) -> Calibration:
    return floor_of(best, rows, total)


#: This process's floors (a vault's process serves one vault; nothing in them is the vault's text).
KEEPER = FloorKeeper()


def space_nearest(
    space: VectorSpace, probes: np.ndarray, limit: int | None, block: int = 4096
) -> tuple[np.ndarray, int, int]:
    """:data:`Nearest` over a vault's vector space: blocks of rows decoded under its lock, scored outside it
    (a search or an embedding batch waits for one block at most)."""
    with space.lock:
        total = len(space.index)
    step = 1 if limit is None or total <= limit else -(-total // limit)
    best = np.full(probes.shape[0], -1.0, dtype=np.float32)
    rows = 0
    for start in range(0, total, block * step):
        with space.lock:
            part = space.index.rows(start, start + block * step, step)
        if part.shape[0] == 0:
            break
        rows += part.shape[0]
        np.maximum(best, (part @ probes.T).max(axis=0), out=best)
    return best, rows, total


def vault_floor(view: VectorView) -> Calibration | None:
    """The calibrated floor of the vault under ``view``'s model (None: too few vectors, use the profile's)."""
    space, embedder = view.space, view.embedder
    count = len(space.index)
    if count < MIN_VECTORS:
        return None
    probes = KEEPER.probes(
        embedder.identity, lambda texts: view.service.probe(view.store, embedder, texts, queries=True)
    )
    return KEEPER.floor(
        view.store.vault_id, embedder.identity, count, probes, lambda p, limit: space_nearest(space, p, limit)
    )


__all__ = [
    "CEILING",
    "KEEPER",
    "Calibration",
    "FloorKeeper",
    "MIN_VECTORS",
    "Nearest",
    "calibrate",
    "floor_of",
    "nearest",
    "probe_texts",
    "space_nearest",
    "vault_floor",
]
