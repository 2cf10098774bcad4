"""The retrieval engine of the daemon: index caches, the active embedder, vectors, status.

Search lives in :mod:`memoriesd.rag.search`, ingestion in :mod:`memoriesd.rag.ingest`, grounded
answers in :mod:`memoriesd.rag.ask`; they all reach the vault's search state through here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import Cancelled, CapExceeded, MemoriesError, ModelUnavailable, VaultLocked
from ..index.caches import INDEX, IndexCache, VaultIndex
from ..index.vectors.maintenance import sealed_status
from ..index.vectors.space import VectorSpace
from ..vault.live import LiveVault
from ..vault.store import VaultStore

log = logging.getLogger("memoriesd.rag")

INSTALL_HINT = (
    "run `memories rag model-install` to download EmbeddingGemma (about 209 MiB), or set [embedding.local] model_dir "
    "to a model directory in config.toml"
)
#: `ask`'s evidence floor for a model whose profile names none (remote embedding services).
DEFAULT_EVIDENCE_FLOOR = 0.25
# The query-vector cache of each vault process (was [rag] query_cache_items / query_cache_seconds).
QUERY_CACHE_ITEMS = 1000
QUERY_CACHE_SECONDS = 300.0


def _return_memory() -> None:
    """Give freed heap back to the system after a large release (glibc keeps it otherwise)."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class RagEngine:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = app.config
        self.home = app.home
        self.cache = IndexCache(self.config.index)
        self._embed_lock = threading.Lock()  # one embedding computation at a time
        self._foreground = 0  # foreground embeddings waiting or running: background work yields to them
        self._foreground_lock = threading.Lock()
        self._local: Any = None
        self._local_dir: Path | None = None
        self._local_stamp: tuple[tuple[str, int, int], ...] = ()
        self._local_used = 0.0  # monotonic time of the last request that needed the local model
        self._idle_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._remote: Any = None
        self._http: Any = None
        self._state_lock = threading.Lock()
        self._http_lock = threading.Lock()
        self._segment_ready = False
        # What serves the local model: in the daemon, a vault's process sets this to reach the shared
        # model process (memoriesd.workers.model_client); in-process use loads the model here.
        self.local_factory: Callable[..., Any] | None = None
        from .background import BackgroundIndexer

        self.background = BackgroundIndexer(app, self)
        from ..index.caches import restore_after_unlock

        app.vaults.on_unlock(lambda vault_id: restore_after_unlock(self, vault_id))
        from .query_cache import QueryCache

        # Query vectors in memory only; a vault's entries go when it locks.
        self.query_cache = QueryCache(QUERY_CACHE_ITEMS, QUERY_CACHE_SECONDS)
        app.vaults.on_lock(self.query_cache.forget_vault)

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

    def model_dir(self) -> Path:
        configured = self.config.embedding.local.model_dir
        return Path(configured) if configured else self.home.models / "embeddinggemma"

    def local_model_present(self) -> bool:
        from ..embed.profile import find_graph

        d = self.model_dir()
        return d.is_dir() and find_graph(d) is not None and (d / "tokenizer.json").is_file()

    def embedding_available(self) -> bool:
        return self.embedding_source()[0] != "none"

    def embedding_source(self) -> tuple[str, str]:
        """Which embedder serves searches, and why: ``("local" | "remote" | "none", reason)``.

        ``[embedding] source``: ``local``, only the local model; ``remote``, only the
        [embedding.service] service; ``auto``, the local model when one is installed, else the service.
        Not set (the default): derived, the service when [embedding.service] is configured, else the local
        model. A device-only vault never sends
        text to a service off this device whatever the source (see :meth:`vault_embedding_source`).
        """
        setting = self.config.embedding.source
        remote = self.config.embedding.service.configured
        if setting == "remote" or (setting == "" and remote):
            why = 'source = "remote"' if setting else "[embedding.service] is configured and [embedding] source is not set"
            return "remote", why
        if self.local_model_present():
            why = {
                "local": 'source = "local"',
                "auto": 'source = "auto" and a local model is installed',
            }.get(setting, "no [embedding.service] service is configured")
            return "local", f"{why} ({self.model_dir()})"
        if setting == "auto" and remote:
            return "remote", f'source = "auto" and no local model is installed in {self.model_dir()}'
        why = f"no local model is installed in {self.model_dir()}"
        if remote:  # setting == "local"
            why += ' and source = "local" leaves the [embedding.service] service out'
        elif setting != "local":
            why += " and no [embedding.service] service is configured"
        return "none", why

    def remote_embedding(self) -> bool:
        """Whether the [embedding.service] service is the active embedder (see :meth:`embedding_source`)."""
        return self.embedding_source()[0] == "remote"

    def vault_embedding_source(self, store: VaultStore) -> tuple[str, str]:
        """:meth:`embedding_source` for one vault: a device-only vault never uses a service off this device."""
        source, why = self.embedding_source()
        if source == "remote":
            from ..errors import DeviceOnly
            from ..urls import host_of

            try:
                self.check_remote_policy(store, self.config.embedding.service.url, "embedding")
            except DeviceOnly:
                host = host_of(self.config.embedding.service.url) or "?"
                hint = (
                    'set [embedding] source = "auto" to use the local model for it'
                    if self.local_model_present()
                    else 'install a local model (`memories rag model-install`) and set [embedding] source = "auto"'
                )
                return "none", (
                    f"this vault is device-only and the [embedding.service] service at {host} is off this device "
                    f"({why}): its searches are lexical (bm25) only; {hint}"
                )
        return source, why

    def embedder(self) -> Any:
        """The active embedder (see :meth:`embedding_source`), loaded lazily."""
        if self.remote_embedding():
            with self._state_lock:
                if self._remote is None:
                    from .providers import RemoteEmbedder

                    self._remote = RemoteEmbedder(self.http_client(), self.config.embedding.service, os.environ)
                return self._remote
        with self._state_lock:
            if self._local is not None and self._model_stamp() != self._local_stamp:
                raise ModelUnavailable(
                    f"the model files in {self._local_dir} changed after the daemon loaded them: run `memories daemon restart`"
                )
            if self._local is None:
                if not self.local_model_present():
                    raise ModelUnavailable(f"no embedding model is installed: {INSTALL_HINT}")
                d = self.model_dir()
                t0 = time.perf_counter()
                factory: Callable[..., Any]
                if self.local_factory is not None:
                    factory = self.local_factory
                else:
                    from ..embed.local import LocalEmbedder

                    factory = LocalEmbedder
                self._local = factory(
                    d,
                    threads=min(self.config.embedding.local.threads, os.cpu_count() or 1),
                    max_tokens=self.config.embedding.max_tokens,
                    overrides=self.config.embedding.overrides,
                )
                self._local_dir = d
                self._local_stamp = self._model_stamp()
                if self.local_factory is None:  # the model process logs its own load
                    log.info("local embedding model loaded in %.2f s (%d dims)", time.perf_counter() - t0, self._local.dimensions)
                self._start_idle_watch()
            self._local_used = time.monotonic()
            return self._local

    # ------------------------------------------------------------------ releasing an idle model

    def _start_idle_watch(self) -> None:
        """Caller holds ``_state_lock``. One watcher thread while a local model is loaded."""
        minutes = self.config.embedding.local.idle_minutes
        if minutes <= 0 or (self._idle_thread is not None and self._idle_thread.is_alive()):
            return
        interval = max(0.05, min(30.0, minutes * 60 / 4))

        def watch() -> None:
            while not self._stopping.wait(interval):
                if self.release_idle_model():
                    return

        self._idle_thread = threading.Thread(target=watch, name="memoriesd-model-idle", daemon=True)
        self._idle_thread.start()

    def release_idle_model(self, *, force: bool = False) -> bool:
        """Drop the local model after ``[embedding.local] idle_minutes`` without a request that needed it
        (never during an embedding batch), so a day of BM25-only use does not keep ~1 GiB of model.
        The next request that needs it loads it again. True when it was released."""
        minutes = self.config.embedding.local.idle_minutes
        with self._state_lock:
            if self._local is None:
                return True
            if not force and (minutes <= 0 or time.monotonic() - self._local_used < minutes * 60):
                return False
            if not self._embed_lock.acquire(blocking=False):
                return False
            try:
                self._local = None
                self._local_stamp = ()
                self._idle_thread = None
            finally:
                self._embed_lock.release()
        _return_memory()
        if self.local_factory is None:  # the model process logs its own end
            log.info("local embedding model released (unused for %.1f minutes)", minutes)
        return True

    def close(self) -> None:
        self._stopping.set()

    def _model_stamp(self) -> tuple[tuple[str, int, int], ...]:
        """Size and mtime of the model files, to notice when they change under a loaded model."""
        d = self.model_dir()
        out = []
        for p in sorted(d.rglob("*")) if d.is_dir() else []:
            if p.is_file() and not p.name.startswith("."):
                st = p.stat()
                out.append((str(p.relative_to(d)), st.st_size, st.st_mtime_ns))
        return tuple(out)

    def http_client(self) -> Any:
        """The one HTTP client of the daemon (created on first use)."""
        with self._http_lock:
            if self._http is None:
                from ..net.http_client import HttpClient

                self._http = HttpClient(self.config.http)
            return self._http

    def check_remote_policy(self, store: VaultStore, url: str, what: str) -> None:
        from .policy import check_device_policy

        check_device_policy(bool(store.settings.get("policy.device_only", False)), url, what)

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

    def vector_space(self, store: VaultStore, idx: VaultIndex, embedder: Any) -> VectorSpace:
        """Attach (or reuse) the vectors of ``embedder`` to ``idx``."""
        dims = embedder.dimensions
        if dims is None:  # a remote service of unknown width: learn it from one query (not under the index lock)
            self.check_remote_policy(store, embedder.url, "embedding")
            embedder.embed_queries(["dimension probe"])
            dims = embedder.dimensions
        with idx.lock:
            space = idx.vectors
            if space is None or space.identity != embedder.identity:
                if space is not None:
                    space.close()
                space = VectorSpace(idx, embedder.identity, int(dims), self.config.index.max_vector_mib,
                                    windows=self.config.index.conversation_windows)
                idx.vectors = space
            space.attach(idx)
            return space

    def embed_missing(
        self,
        store: VaultStore,
        idx: VaultIndex,
        space: VectorSpace,
        embedder: Any,
        frag_ids: list[int],
        ctx: Any,
        *,
        deadline: float | None = None,
        progress: Any = None,
        background: bool = False,
    ) -> int:
        """Embed some fragments; stops on lock, vault change or cancellation (finished batches kept).

        ``background``: yield to foreground embeddings (queries, on-demand search, `rag index`)
        before each batch.
        """
        if not frag_ids:
            return 0
        if getattr(embedder, "url", None):
            self.check_remote_policy(store, embedder.url, "embedding")
        check = self.operation_check(store, ctx)

        def embed_fn(items: list[tuple[str | None, str]]) -> np.ndarray:
            # The embedding lock is taken per batch, not per pass: a long `rag index` lets the
            # query embedding of a search (or another vault's batch) in between its batches.
            if background:
                while self._foreground:
                    check()
                    time.sleep(0.01)
            with self._embedding(foreground=not background):
                if getattr(embedder, "url", None):
                    return np.asarray(embedder.embed_documents(items, before_attempt=check))
                self._local_used = time.monotonic()  # a long pass keeps its model loaded
                return np.asarray(embedder.embed_documents(items))

        return space.embed(idx, frag_ids, embed_fn, check=check, deadline=deadline, on_batch=progress)

    @staticmethod
    def operation_check(store: VaultStore, ctx: Any) -> Callable[[], None]:
        """A check run before each batch and each remote attempt: lock, vault change, client gone."""
        gen = store.generation

        def check() -> None:
            if store.closed:
                raise Cancelled(f"vault {store.name} was locked: the operation was cancelled")
            if store.generation != gen:
                raise Cancelled("the vault changed during the operation: run it again")
            ctx.check_cancelled()

        return check

    def embed_query(self, embedder: Any, store: VaultStore, query: str, ctx: Any) -> np.ndarray:
        from .query_cache import cache_key

        key = cache_key(store.vault_id, embedder, query)
        if (hit := self.query_cache.get(key)) is not None:
            return hit
        if getattr(embedder, "url", None):
            self.check_remote_policy(store, embedder.url, "embedding")
            check = self.operation_check(store, ctx)
            vec = np.asarray(embedder.embed_queries([query], before_attempt=check))[0]
        else:
            with self._embedding(foreground=True):
                self._local_used = time.monotonic()
                vec = np.asarray(embedder.embed_queries([query]))[0]
        self.query_cache.put(key, vec)
        return vec

    def embed_document(self, embedder: Any, store: VaultStore, title: str | None, text: str, ctx: Any) -> np.ndarray:
        """One text embedded as a vault fragment is (document prompt): e.g. a new fact, to compare with stored ones."""
        if getattr(embedder, "url", None):
            self.check_remote_policy(store, embedder.url, "embedding")
            return np.asarray(embedder.embed_documents([(title, text)], before_attempt=self.operation_check(store, ctx)))[0]
        with self._embedding(foreground=True):
            self._local_used = time.monotonic()
            return np.asarray(embedder.embed_documents([(title, text)]))[0]

    @contextlib.contextmanager
    def _embedding(self, *, foreground: bool) -> Iterator[None]:
        """The embedding lock; a foreground holder or waiter makes background batches wait."""
        if foreground:
            with self._foreground_lock:
                self._foreground += 1
        try:
            with self._embed_lock:
                yield
        finally:
            if foreground:
                with self._foreground_lock:
                    self._foreground -= 1

    def vector_weight(self, embedder: Any) -> float:
        """Hybrid's vector weight when `rag search --vector-weight` is not given: the model profile's measured one."""
        profile = getattr(embedder, "profile", None)
        return float(getattr(profile, "vector_weight", 1.0))

    def evidence_floor(self, embedder: Any) -> float | None:
        """`ask`'s cosine floor: ``[search] min_cosine`` when set (-1 = none), else the model profile's calibrated one."""
        configured = float(self.config.search.min_cosine)
        if configured == -1:
            return None
        if configured != 0:
            return configured
        profile = getattr(embedder, "profile", None)
        return float(getattr(profile, "ask_min_cosine", DEFAULT_EVIDENCE_FLOOR))

    @staticmethod
    def skipped_count(space: VectorSpace) -> int:
        """Fragments of ``space`` that cannot be embedded (recorded as skipped)."""
        return len(getattr(space, "skipped", ()))

    # ------------------------------------------------------------------ status

    def status(self, store: VaultStore) -> dict[str, Any]:
        idx = self.peek_index(store)
        cards = [r for r in store.latest() if r.kind == "card"]
        searchable = [r for r in store.latest() if r.searchable]
        if idx is None or idx.bm25 is None:
            state = "none"
        elif idx.generation != store.generation:
            state = "stale"
        else:
            state = "built"
        out: dict[str, Any] = {
            "vault_id": store.vault_id,
            "documents": len(cards),
            "searchable_records": len(searchable),
            "bytes": sum(len(r.body.encode("utf-8")) for r in cards),
            "index": state,
            "fragments": idx.n_fragments() if idx is not None and idx.bm25 is not None else None,
            "cache": {
                "source_bytes": idx.source_bytes if idx is not None else 0,
                "max_fragments": self.config.index.max_fragments,
                "max_source_mib": self.config.index.max_source_mib,
                "max_vector_mib": self.config.index.max_vector_mib,
                "max_vaults": self.cache.max_vaults,
                "cached_vaults": len(self.cache.cached_ids()),
            },
            "embedding": {"available": self.embedding_available()},
        }
        # Which embedder serves this vault (local, remote or none) and why: [embedding] source.
        served_by, reason = self.vault_embedding_source(store)
        out["embedding"].update({"served_by": served_by, "reason": reason})
        if out["fragments"] is None:
            # No index yet: count what it would hold without building it (state stays "none").
            from ..index.docs import check_caps
            from ..kinds.registry import kind_of
            from ..text.fragments import split_fragments

            n_frags = 0
            size = 0
            for r in searchable:
                frags = split_fragments(r.id, r.revision, r.body, bytes(32), skip=kind_of(r.kind).body_start(r))
                n_frags += max(1, len(frags)) if r.title.strip() or frags else 0
                size += len(r.title.encode("utf-8")) + len(r.body.encode("utf-8"))
            out["fragments"] = n_frags
            out["cache"]["source_bytes"] = size
            try:
                check_caps(n_frags, size, self.config.index)
            except CapExceeded as exc:
                out["index"] = "over_cap"
                out["cap_error"] = exc.message
        if self.embedding_available():
            out["embedding"]["source"] = self._describe_model()  # the model directory or remote service
        if idx is not None and idx.vectors is not None:
            space = idx.vectors
            out["embedding"].update(
                {
                    "model": space.identity,
                    "dimensions": space.dims,
                    "embedded": len(space.index),
                    "total": idx.n_vectors(space.windows),
                    "skipped": self.skipped_count(space),
                    "vector_bytes": space.nbytes,
                    "vectors_loaded": True,
                }
            )
        elif self.embedding_available():
            out["embedding"]["model"] = self._describe_model()
            out["embedding"]["embedded"] = None
            out["embedding"]["vectors_loaded"] = False
            # Not loaded yet (unlock, restart): count the sealed vectors of live fragments instead.
            identity, dims = self._known_identity()
            sealed = sealed_status(store, identity=identity, dims=dims, remote=self.remote_embedding(),
                                   windows=self.config.index.conversation_windows)
            if sealed is not None:
                out["embedding"].update(sealed)
        else:
            out["embedding"]["hint"] = INSTALL_HINT
        self._background_status(store, out["embedding"])
        return out

    def _background_status(self, store: VaultStore, emb: dict[str, Any]) -> None:
        """``state`` (running, queued, paused, done, failed, off), ``rate`` (fragments/s) and ``eta_seconds``."""
        emb.setdefault("skipped", 0)
        job = self.background.job(store.vault_id) if self.background.enabled() else None
        if job is None:
            if not self.background.enabled():
                state = "off"
            elif emb.get("embedded") is not None and emb.get("total") is not None and emb["embedded"] + emb["skipped"] >= emb["total"]:
                state = "done"
            else:
                state = "idle"
            emb.update({"state": state, "rate": None, "eta_seconds": None})
            return
        view = job.view()
        emb.update({"state": view["state"], "rate": view["rate"], "eta_seconds": view["eta_seconds"]})
        if view["error"]:
            emb["error"] = view["error"]

    def _known_identity(self) -> tuple[str | None, int | None]:
        """Identity and dimensions of the active embedder when known without loading a model
        (a remote service's identity comes from the config; a local model's only once loaded)."""
        if self.remote_embedding():
            try:
                remote = self.embedder()  # builds the client only: no request is sent
            except MemoriesError:
                return None, None
            return remote.identity, remote.dimensions
        local = self._local
        if local is not None:
            return str(local.identity), int(local.dimensions)
        return None, None

    def _describe_model(self) -> str:
        if self.remote_embedding():
            svc = self.config.embedding.service
            return f"remote:{svc.protocol}:{svc.model}"
        return str(self.model_dir())
