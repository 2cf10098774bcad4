"""The daemon's one embedding service: which embedder serves searches, and every embedding call.

It decides the embedder (``[embedding] source``, :meth:`EmbeddingService.source`) once per
model-directory stamp — the config of a daemon never changes while it runs — and owns what goes
with it: loading the local model (in process, or through the model process's client), releasing it
after ``[embedding.local] idle_minutes`` unused, the embedding lock that lets foreground work (queries,
on-demand search embedding, ``rag index``) go before background batches, the in-memory query cache,
and the device policy of a vault before any text goes to a service.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import Cancelled, DeviceOnly, MemoriesError, ModelUnavailable
from .query_cache import QueryCache, cache_key
from .stamp import DirStamp, Stamp
from .types import Cancellable, Check, DocumentItem, Embedder, LocalModel, Tokenizing

if TYPE_CHECKING:
    from ..config import Config
    from ..home import Home
    from ..vault.store import VaultStore

log = logging.getLogger("memoriesd.rag")

INSTALL_HINT = (
    "run `memories rag model-install` to download EmbeddingGemma (about 209 MiB), or set [embedding.local] model_dir "
    "to a model directory in config.toml"
)
#: The fixed relevance floor of a model whose profile names none (remote embedding services), where a
#: vault has too few vectors for its own (memoriesd.rag.floor).
DEFAULT_EVIDENCE_FLOOR = 0.25
# The query-vector cache of each vault process (was [rag] query_cache_items / query_cache_seconds).
QUERY_CACHE_ITEMS = 1000
QUERY_CACHE_SECONDS = 300.0

#: Builds the local embedder: ``factory(model_dir, threads=, max_tokens=, overrides=)``.
LocalFactory = Callable[..., LocalModel]
#: Raises :class:`memoriesd.errors.DeviceOnly` when ``store`` may not send text to ``url``:
#: ``policy(store, url, what)`` (:func:`memoriesd.rag.policy.check_store_policy`).
Policy = Callable[["VaultStore", str, str], None]


@dataclass(frozen=True)
class Choice:
    """Which embedder serves searches and why (``source``: ``local``, ``remote`` or ``none``)."""

    source: str
    reason: str
    local_present: bool


def operation_check(store: VaultStore, ctx: Cancellable) -> Check:
    """A check run before each batch and each remote attempt: lock, vault change, client gone."""
    gen = store.generation

    def check() -> None:
        if store.closed:
            raise Cancelled(f"vault {store.name} was locked: the operation was cancelled")
        if store.generation != gen:
            raise Cancelled("the vault changed during the operation: run it again")
        ctx.check_cancelled()

    return check


class _NoClient:
    """The context of work no client waits for (it is never cancelled by one)."""

    def check_cancelled(self) -> None:
        return None


_NO_CLIENT = _NoClient()


def _return_memory() -> None:
    """Give freed heap back to the system after a large release (glibc keeps it otherwise)."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class EmbeddingService:
    def __init__(self, config: Config, home: Home, *, remote: Callable[[], Embedder], policy: Policy) -> None:
        """``remote`` builds the [embedding.service] service's embedder (the retrieval layer owns its
        client); ``policy`` is the vault's device policy, checked before any text leaves."""
        self.config = config
        self.home = home
        self._make_remote = remote
        self._policy = policy
        self._embed_lock = threading.Lock()  # one embedding computation at a time
        self._foreground = 0  # foreground embeddings waiting or running: background work yields to them
        self._foreground_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._local: LocalModel | None = None
        self._local_dir: Path | None = None
        self._local_stamp: Stamp = ()
        self._local_used = 0.0  # monotonic time of the last request that needed the local model
        self._idle_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._remote: Embedder | None = None
        self._stamp = DirStamp(self.model_dir())
        self._choice: tuple[Stamp, Choice] | None = None
        # What serves the local model: in the daemon, a vault's process sets this to reach the shared
        # model process (memoriesd.workers.model_client); in-process use loads the model here.
        self.local_factory: LocalFactory | None = None
        # Query vectors in memory only; a vault's entries go when it locks (the engine registers that).
        self.query_cache = QueryCache(QUERY_CACHE_ITEMS, QUERY_CACHE_SECONDS)

    # ------------------------------------------------------------------ the choice

    def model_dir(self) -> Path:
        configured = self.config.embedding.local.model_dir
        return Path(configured) if configured else self.home.models / "embeddinggemma"

    def choice(self) -> Choice:
        """The embedder decision, recomputed only when the model directory's stamp changed."""
        return self._stamped()[1]

    def _stamped(self) -> tuple[Stamp, Choice]:
        stamp = self._stamp.current()
        cached = self._choice
        if cached is not None and cached[0] == stamp:
            return cached
        made = (stamp, self._decide())
        self._choice = made
        return made

    def _decide(self) -> Choice:
        """``[embedding] source``: ``local``, only the local model; ``remote``, only the
        [embedding.service] service; ``auto``, the local model when one is installed, else the service.
        Not set (the default): derived, the service when [embedding.service] is configured, else the local
        model. A device-only vault never sends
        text to a service off this device whatever the source (see :meth:`vault_source`)."""
        from .profile import find_graph

        d = self.model_dir()
        present = d.is_dir() and find_graph(d) is not None and (d / "tokenizer.json").is_file()
        setting = self.config.embedding.source
        remote = self.config.embedding.service.configured
        if setting == "remote" or (setting == "" and remote):
            why = 'source = "remote"' if setting else "[embedding.service] is configured and [embedding] source is not set"
            return Choice("remote", why, present)
        if present:
            why = {
                "local": 'source = "local"',
                "auto": 'source = "auto" and a local model is installed',
            }.get(setting, "no [embedding.service] service is configured")
            return Choice("local", f"{why} ({d})", present)
        if setting == "auto" and remote:
            return Choice("remote", f'source = "auto" and no local model is installed in {d}', present)
        why = f"no local model is installed in {d}"
        if remote:  # setting == "local"
            why += ' and source = "local" leaves the [embedding.service] service out'
        elif setting != "local":
            why += " and no [embedding.service] service is configured"
        return Choice("none", why, present)

    def source(self) -> tuple[str, str]:
        """Which embedder serves searches, and why: ``("local" | "remote" | "none", reason)``."""
        c = self.choice()
        return c.source, c.reason

    def available(self) -> bool:
        return self.choice().source != "none"

    def remote(self) -> bool:
        """Whether the [embedding.service] service is the active embedder."""
        return self.choice().source == "remote"

    def vault_source(self, store: VaultStore) -> tuple[str, str]:
        """:meth:`source` for one vault: a device-only vault never uses a service off this device."""
        choice = self.choice()
        if choice.source != "remote":
            return choice.source, choice.reason
        from ..urls import host_of

        try:
            self._policy(store, self.config.embedding.service.url, "embedding")
        except DeviceOnly:
            host = host_of(self.config.embedding.service.url) or "?"
            hint = (
                'set [embedding] source = "auto" to use the local model for it'
                if choice.local_present
                else 'install a local model (`memories rag model-install`) and set [embedding] source = "auto"'
            )
            return "none", (
                f"this vault is device-only and the [embedding.service] service at {host} is off this device "
                f"({choice.reason}): its searches are lexical (bm25) only; {hint}"
            )
        return choice.source, choice.reason

    # ------------------------------------------------------------------ the embedder

    def embedder(self, *, store: VaultStore | None = None) -> Embedder:
        """The active embedder (see :meth:`source`), loaded lazily. With ``store``, a remote service
        is checked against the vault's device policy first, before its client exists."""
        stamp, choice = self._stamped()
        if choice.source == "remote":
            if store is not None:
                self._policy(store, self.config.embedding.service.url, "embedding")
            with self._state_lock:
                if self._remote is None:
                    self._remote = self._make_remote()
                return self._remote
        with self._state_lock:
            if self._local is not None and stamp != self._local_stamp:
                raise ModelUnavailable(
                    f"the model files in {self._local_dir} changed after the daemon loaded them: run `memories daemon restart`"
                )
            if self._local is None:
                self._local = self._load(choice)
                self._local_stamp = self._stamp.current()  # as loaded (the load took time)
                self._start_idle_watch()
            self._local_used = time.monotonic()
            return self._local

    def _load(self, choice: Choice) -> LocalModel:
        """Caller holds ``_state_lock``."""
        if not choice.local_present:
            raise ModelUnavailable(f"no embedding model is installed: {INSTALL_HINT}")
        d = self.model_dir()
        t0 = time.perf_counter()
        factory = self.local_factory
        if factory is None:
            from .local import LocalEmbedder

            factory = LocalEmbedder
        local = factory(
            d,
            threads=min(self.config.embedding.local.threads, os.cpu_count() or 1),
            max_tokens=self.config.embedding.max_tokens,
            overrides=self.config.embedding.overrides,
        )
        self._local_dir = d
        if self.local_factory is None:  # the model process logs its own load
            log.info("local embedding model loaded in %.2f s (%d dims)", time.perf_counter() - t0, local.dimensions or 0)
        return local

    def tokenizer(self) -> Tokenizing | None:
        """The local model's tokenizer when the local model is the embedder (loaded if need be), else None."""
        if self.choice().source != "local":
            return None
        self.embedder()
        return self._local

    def known_identity(self) -> tuple[str | None, int | None]:
        """Identity and dimensions of the active embedder when known without loading a model
        (a remote service's identity comes from the config; a local model's only once loaded)."""
        if self.remote():
            try:
                remote = self.embedder()  # builds the client only: no request is sent
            except MemoriesError:
                return None, None
            return remote.identity, remote.dimensions
        local = self._local
        if local is not None:
            return str(local.identity), local.dimensions
        return None, None

    def describe(self) -> str:
        """The model directory, or ``remote:<protocol>:<model>``."""
        if self.remote():
            svc = self.config.embedding.service
            return f"remote:{svc.protocol}:{svc.model}"
        return str(self.model_dir())

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

    # ------------------------------------------------------------------ embedding

    @contextlib.contextmanager
    def _embedding(self, embedder: Embedder, *, foreground: bool) -> Iterator[None]:
        """The embedding lock; a foreground holder or waiter makes background batches wait.

        An embedder served by the model process (``queued``) takes no lock here: the model process
        orders every vault's work by one policy (:mod:`memoriesd.embed.schedule`), and a query held
        here behind this vault's own batch (itself waiting there for another vault) would wait for both."""
        if foreground:
            with self._foreground_lock:
                self._foreground += 1
        try:
            queued = bool(getattr(embedder, "queued", False))  # ModelClient: the workers layer, above this one
            with contextlib.nullcontext() if queued else self._embed_lock:
                if not embedder.remote:
                    self._local_used = time.monotonic()  # a long pass keeps its model loaded
                yield
        finally:
            if foreground:
                with self._foreground_lock:
                    self._foreground -= 1

    def check_policy(self, store: VaultStore, embedder: Embedder) -> None:
        """Before any text of ``store`` goes to a remote embedder: the vault's device policy."""
        if embedder.remote:
            self._policy(store, self.config.embedding.service.url, "embedding")

    def batch(
        self, embedder: Embedder, items: Sequence[DocumentItem], check: Check, *, background: bool = False
    ) -> np.ndarray:
        """One batch of fragments (document prompt), under the embedding lock; the caller checked the
        device policy (:meth:`check_policy`). ``background``: yield to foreground embeddings (queries,
        on-demand search, `rag index`) first. The lock is taken per batch, not per pass: a long
        `rag index` lets the query embedding of a search (or another vault's batch) in between."""
        if background:
            while self._foreground:
                check()
                time.sleep(0.01)
        with self._embedding(embedder, foreground=not background):
            return np.asarray(embedder.embed_documents(items, before_attempt=check if embedder.remote else None))

    def query(self, store: VaultStore, embedder: Embedder, query: str, ctx: Cancellable) -> np.ndarray:
        """A query's vector (query prompt), from the query cache when it holds one. A remote
        service's request takes no lock (it runs beside the local model's work)."""
        key = cache_key(store.vault_id, embedder, query)
        if (hit := self.query_cache.get(key)) is not None:
            return hit
        if embedder.remote:
            self.check_policy(store, embedder)
            vec = np.asarray(embedder.embed_queries([query], before_attempt=operation_check(store, ctx)))[0]
        else:
            with self._embedding(embedder, foreground=True):
                vec = np.asarray(embedder.embed_queries([query]))[0]
        self.query_cache.put(key, vec)
        return vec

    def document(self, store: VaultStore, embedder: Embedder, title: str | None, text: str, ctx: Cancellable) -> np.ndarray:
        """One text embedded as a vault fragment is (document prompt): e.g. a new fact, to compare with stored ones."""
        if embedder.remote:
            self.check_policy(store, embedder)
            return np.asarray(embedder.embed_documents([(title, text)], before_attempt=operation_check(store, ctx)))[0]
        with self._embedding(embedder, foreground=True):
            return np.asarray(embedder.embed_documents([(title, text)]))[0]

    def probe(self, store: VaultStore, embedder: Embedder, texts: Sequence[str], *, queries: bool) -> np.ndarray:
        """Texts that are no user's (the relevance floor's probes, the language check's sample sentences),
        embedded as queries or as fragments under the embedding lock and never cached."""
        if embedder.remote:
            self.check_policy(store, embedder)
            check = operation_check(store, _NO_CLIENT)
            if queries:
                return np.asarray(embedder.embed_queries(texts, before_attempt=check))
            return np.asarray(embedder.embed_documents([(None, t) for t in texts], before_attempt=check))
        with self._embedding(embedder, foreground=True):
            if queries:
                return np.asarray(embedder.embed_queries(texts))
            return np.asarray(embedder.embed_documents([(None, t) for t in texts]))

    # ------------------------------------------------------------------ profile values

    def vector_weight(self, embedder: Embedder | None) -> float:
        """Hybrid's vector weight when `rag search --vector-weight` is not given: the model profile's measured one."""
        profile = embedder.profile if embedder is not None else None
        return float(profile.vector_weight) if profile is not None else 1.0

    def configured_floor(self) -> float | None:
        """``[search] min_cosine`` when set (-1.0 = no floor); None = 0, the floor calibrated per vault
        (:mod:`memoriesd.rag.floor`)."""
        configured = float(self.config.search.min_cosine)
        return None if configured == 0 else configured

    def evidence_floor(self, embedder: Embedder | None) -> float | None:
        """The fixed cosine floor: ``[search] min_cosine`` when set (-1 = none), else the model profile's
        (used where a vault has too few vectors to calibrate its own: :mod:`memoriesd.rag.floor`)."""
        configured = self.configured_floor()
        if configured is not None:
            return None if configured <= -1 else configured
        profile = embedder.profile if embedder is not None else None
        return float(profile.ask_min_cosine) if profile is not None else DEFAULT_EVIDENCE_FLOOR


__all__ = ["Choice", "DEFAULT_EVIDENCE_FLOOR", "EmbeddingService", "INSTALL_HINT", "LocalFactory", "Policy", "operation_check"]
