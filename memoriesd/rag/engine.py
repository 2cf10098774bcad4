"""The retrieval engine of a vault process: the index caches, the embedding service, background indexing.

What it holds, each in its own module: the search state of unlocked vaults (:mod:`memoriesd.index.caches`),
the embedder and every embedding call (:class:`memoriesd.embed.service.EmbeddingService`, ``engine.embedding``),
the vector recipe (:mod:`memoriesd.rag.vector_view`) and the background indexer. Search lives in
:mod:`memoriesd.rag.search`, ingestion in :mod:`memoriesd.rag.ingest`, grounded answers in
:mod:`memoriesd.rag.ask`, status in :mod:`memoriesd.rag.status`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..embed.service import DEFAULT_EVIDENCE_FLOOR, INSTALL_HINT, EmbeddingService, operation_check
from ..embed.types import Cancellable, Embedder
from ..errors import VaultLocked
from ..index.caches import INDEX, IndexCache, VaultIndex
from ..vault.live import LiveVault
from ..vault.store import VaultStore
from .policy import check_store_policy

if TYPE_CHECKING:
    from ..config import Config
    from ..home import Home
    from ..net.http_client import HttpClient
    from ..vault.manager import VaultManager

log = logging.getLogger("memoriesd.rag")

__all__ = ["DEFAULT_EVIDENCE_FLOOR", "INSTALL_HINT", "RagEngine"]


class EngineHost(Protocol):
    """What the engine uses of the daemon's app (memoriesd.server.daemon.App)."""

    @property
    def config(self) -> Config: ...

    @property
    def home(self) -> Home: ...

    @property
    def vaults(self) -> VaultManager: ...


class RagEngine:
    def __init__(self, app: EngineHost) -> None:
        self.app = app
        self.config = app.config
        self.home = app.home
        self.cache = IndexCache(self.config.index)
        self._http: HttpClient | None = None
        self._http_lock = threading.Lock()
        self._segment_ready = False
        self.embedding = EmbeddingService(self.config, self.home, remote=self._remote_embedder, policy=check_store_policy)
        from .background import BackgroundIndexer

        self.background = BackgroundIndexer(app, self)
        from ..index.caches import restore_after_unlock

        app.vaults.on_unlock(lambda vault_id: restore_after_unlock(self, vault_id))
        # Query vectors in memory only; a vault's entries go when it locks.
        app.vaults.on_lock(self.embedding.query_cache.forget_vault)

    # ------------------------------------------------------------------ plumbing

    def warm(self) -> None:
        """Load jieba's dictionary in the background at start-up, so the first search is fast."""
        try:
            self._ensure_segmentation()
        except Exception:  # never fatal: the first search will report it
            log.exception("warming the segmenter failed")

    def _ensure_segmentation(self) -> None:
        if not self._segment_ready:
            from ..text.segment import configure

            private = self.home.cache / "jieba"
            private.mkdir(mode=0o700, parents=True, exist_ok=True)
            configure(private)
            self._segment_ready = True

    def close(self) -> None:
        self.embedding.close()

    def http_client(self) -> HttpClient:
        """The one HTTP client of the daemon (created on first use)."""
        with self._http_lock:
            if self._http is None:
                from ..net.http_client import HttpClient

                self._http = HttpClient(self.config.http)
            return self._http

    def _remote_embedder(self) -> Embedder:
        """The [embedding.service] service's embedder, on the daemon's one HTTP client."""
        import os

        from .providers import RemoteEmbedder

        return RemoteEmbedder(self.http_client(), self.config.embedding.service, os.environ)

    def check_remote_policy(self, store: VaultStore, url: str, what: str) -> None:
        check_store_policy(store, url, what)

    @staticmethod
    def operation_check(store: VaultStore, ctx: Cancellable) -> Callable[[], None]:
        """A check run before each batch and each remote attempt: lock, vault change, client gone."""
        return operation_check(store, ctx)

    # ------------------------------------------------------------------ indexes

    def vault_index(self, vault: LiveVault) -> VaultIndex:
        """The refreshed search state of an unlocked vault (built on first use).

        The caller holds a lease on the vault (``VaultManager.use``): the index belongs to the
        vault's owner and is never closed under a leased operation.
        """
        self._ensure_segmentation()
        idx = self.cache.get(vault)
        with idx.lock:
            if not vault.is_open:
                raise VaultLocked(f"vault {vault.name} is locked: run `memories vault unlock {vault.name}`")
            idx.refresh()
        return idx

    def peek_index(self, store: VaultStore) -> VaultIndex | None:
        """The vault's index if one is built (builds nothing)."""
        live = self.app.vaults.live(store.vault_id)
        if live is None or live.store is not store:
            return None
        idx = live.peek(INDEX)
        return idx if isinstance(idx, VaultIndex) else None

    def status(self, store: VaultStore) -> dict[str, Any]:
        """``rag status`` of one vault (:func:`memoriesd.rag.status.vault_status`)."""
        from .status import vault_status

        return vault_status(self, store)
