"""The one vector recipe: attach the embedder's vectors, embed what is missing, query them.

Search (and with it ``rag context`` and ``rag ask``), ``memory forget``, fact matching, ``rag index``
and the background indexer all go through :func:`open_view` and :meth:`VectorView.ensure`:

- **on demand** (``limit``: search, forget): at most ``[search] on_demand_embed_limit`` missing
  fragments are embedded before answering; while the background indexer works on the vault and more
  than :data:`BACKGROUND_ON_DEMAND` are missing, nothing is embedded (the answer uses what exists,
  never waits behind the job). :meth:`Coverage.notice` says what the vector side could not cover.
- **a pass** (``limit=None``: ``rag index``; ``among``: the facts to compare; ``background``: the
  background indexer's chunk, which yields to foreground work) embeds everything it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..embed.service import operation_check
from ..index.vectors.space import VectorSpace
from ..text.humanize import duration

if TYPE_CHECKING:
    from ..config import Config
    from ..embed.service import EmbeddingService
    from ..embed.types import Cancellable, DocumentItem, Embedder
    from ..index.caches import VaultIndex
    from ..vault.store import VaultStore


class _Progress(Protocol):
    @property
    def eta_seconds(self) -> float | None: ...


class _Indexer(Protocol):
    def job(self, vault_id: str) -> _Progress | None: ...

    def active(self, vault_id: str) -> bool: ...


class ViewEngine(Protocol):
    """What the vector recipe uses of the retrieval engine (:class:`memoriesd.rag.engine.RagEngine`):
    named by this Protocol, so that the engine, its background indexer and the recipe import no circle."""

    @property
    def config(self) -> Config: ...

    @property
    def embedding(self) -> EmbeddingService: ...

    @property
    def background(self) -> _Indexer: ...


#: While the background indexer works on a vault, an on-demand caller still embeds this few missing
#: fragments itself (a note just added), not more.
BACKGROUND_ON_DEMAND = 8


@dataclass(frozen=True)
class Coverage:
    """What :meth:`VectorView.ensure` did: ``embedded`` fragments, ``left`` still without a vector
    (``deferred``: left to the running background job, which expects to finish in ``eta_seconds``)."""

    embedded: int = 0
    left: int = 0
    deferred: bool = False
    eta_seconds: float | None = None

    def notice(self, *, words_only: bool = False) -> str | None:
        """The notice for a partial vector side; ``words_only``: the wording of `memory forget`, whose
        uncovered fragments were matched by words alone."""
        if not self.left:
            return None
        eta = f" (about {duration(self.eta_seconds)} left)" if self.eta_seconds else ""
        if self.deferred:
            what = " and were matched by words only" if words_only else ", so vector results cover only part of the vault"
            return f"{self.left:,} fragments are still being embedded in the background{what}{eta}: see `memories rag status`"
        if words_only:
            return (f"{self.left:,} fragments have no vector yet and were matched by words only: "
                    "run `memories rag index` first to match them by meaning too")
        return (f"{self.left:,} fragments have no vector yet, so vector results cover only part of the vault: "
                "run `memories rag index` to embed them")


class VectorView:
    """The vectors of one vault index under one embedder, with the service that embeds for it."""

    def __init__(self, engine: ViewEngine, store: VaultStore, idx: VaultIndex, embedder: Embedder, space: VectorSpace) -> None:
        self.engine = engine
        self.service: EmbeddingService = engine.embedding
        self.store = store
        self.idx = idx
        self.embedder = embedder
        self.space = space
        self._missing: list[int] | None = None

    def missing(self) -> list[int]:
        """Live fragments (and turn windows) without a vector, skipped ones aside (as of the last
        embedding through this view)."""
        if self._missing is None:
            self._missing = self.space.missing(self.idx)
        return self._missing

    @property
    def total(self) -> int:
        """Vectors the vault's index wants (fragments and turn windows)."""
        return self.idx.n_vectors(self.space.windows)

    @property
    def skipped(self) -> int:
        """Fragments that cannot be embedded (recorded as skipped)."""
        return len(self.space.skipped)

    def ensure(
        self,
        ctx: Cancellable,
        *,
        limit: int | None,
        among: Collection[int] | None = None,
        background: bool = False,
        deadline: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Coverage:
        """Embed missing fragments (of ``among`` when given), at most ``limit`` (None: all).

        With a ``limit`` (on demand) and the background indexer busy on this vault, only up to
        :data:`BACKGROUND_ON_DEMAND` missing fragments are embedded here; more are left to it.
        ``background``: the indexer's own chunk (yields to foreground embeddings). Stops on lock,
        vault change or cancellation (finished batches are kept).
        """
        missing = self.missing() if among is None else [fid for fid in among if fid not in self.space.index]
        if not missing:
            return Coverage()
        if limit is not None and not background:
            bg = self.engine.background
            job = bg.job(self.store.vault_id) if bg.active(self.store.vault_id) else None
            if job is not None and len(missing) > BACKGROUND_ON_DEMAND:
                return Coverage(left=len(missing), deferred=True, eta_seconds=job.eta_seconds)
        todo = missing if limit is None else missing[:limit]
        n = self.embed(todo, ctx, background=background, deadline=deadline, progress=progress)
        return Coverage(embedded=n, left=len(missing) - len(todo))

    def embed(
        self,
        frag_ids: list[int],
        ctx: Cancellable,
        *,
        background: bool = False,
        deadline: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Embed ``frag_ids`` in batches (each under the embedding lock); how many got a vector."""
        if not frag_ids:
            return 0
        self._missing = None
        self.service.check_policy(self.store, self.embedder)
        check = operation_check(self.store, ctx)

        def embed_fn(items: list[DocumentItem]) -> np.ndarray:
            return self.service.batch(self.embedder, items, check, background=background)

        return self.space.embed(self.idx, frag_ids, embed_fn, check=check, deadline=deadline, on_batch=progress)

    def query_vector(self, query: str, ctx: Cancellable) -> np.ndarray:
        """The query's vector (query prompt; from the query cache when it holds one)."""
        return self.service.query(self.store, self.embedder, query, ctx)

    def document_vector(self, title: str | None, text: str, ctx: Cancellable) -> np.ndarray:
        """A text embedded as a fragment is (document prompt): a new fact, to compare with stored ones."""
        return self.service.document(self.store, self.embedder, title, text, ctx)

    def search(
        self,
        vec: np.ndarray,
        k: int,
        *,
        allowed: Collection[int] | None = None,
        min_score: float | None = None,
        windows: bool = False,
        best_windows: dict[int, int] | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest ``(fragment id, cosine)`` (see :meth:`VectorSpace.search`)."""
        return self.space.search(vec, k, allowed=allowed, min_score=min_score, windows=windows, best_windows=best_windows)


def open_view(engine: ViewEngine, store: VaultStore, idx: VaultIndex, embedder: Embedder | None = None) -> VectorView:
    """Attach (or reuse) the vectors of ``embedder`` (default: the active one) to ``idx``.

    A remote service of unknown width answers one probe query first (outside the index lock, after
    the vault's device policy)."""
    service = engine.embedding
    if embedder is None:
        embedder = service.embedder(store=store)  # the vault's policy first, before a service's client exists
    dims = embedder.dimensions
    if dims is None:
        service.check_policy(store, embedder)
        embedder.embed_queries(["dimension probe"])
        dims = embedder.dimensions
    with idx.lock:
        space = idx.vectors
        if space is None or space.identity != embedder.identity:
            if space is not None:
                space.close()
            space = VectorSpace(idx, embedder.identity, int(dims or 0), engine.config.index.max_vector_mib,
                                windows=engine.config.index.conversation_windows)
            idx.vectors = space
        space.attach(idx)
    return VectorView(engine, store, idx, embedder, space)


__all__ = ["BACKGROUND_ON_DEMAND", "Coverage", "VectorView", "ViewEngine", "open_view"]
