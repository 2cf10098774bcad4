"""Per-vault search state in daemon memory, and the LRU cache that holds it.

A :class:`VaultIndex` is built from an unlocked vault's searchable records on first use: fragments
(keyed fingerprints), the BM25 index and, when an embedder is active, the vector index. It follows
the vault's ``generation``: a change re-indexes only the records whose revision changed. Lock and
daemon restart drop it (see :class:`IndexCache`).

The lexical part is kept at rest as a sealed snapshot (:mod:`memoriesd.index.keeper`): the first
build after unlock restores it and applies only the records changed since, instead of
re-fragmenting and re-segmenting the whole vault.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..config import CacheConfig
from ..errors import Cancelled, CapExceeded, MemoriesError
from ..text.fragments import Fragment
from ..vault import crypto
from ..vault.format import Head
from ..vault.live import LiveVault
from ..vault.records import Record
from ..vault.store import VaultStore
from .bm25 import BM25Index
from .docs import IndexedDoc, check_caps, doc_from_record, doc_source_bytes, index_doc
from .keeper import SnapshotKeeper
from .snapshot import remove_snapshot, snapshot_path
from .vectors.windows import window_id, window_parent

if TYPE_CHECKING:
    from .vectors.space import VectorSpace

log = logging.getLogger("memoriesd.index")

def _windows_of(doc: IndexedDoc) -> int:
    return sum(len(w) for w in doc.windows)


class VaultIndex:
    """Search state of one unlocked vault (see module docstring). Guarded by ``self.lock``."""

    def __init__(
        self,
        store: VaultStore,
        cache_cfg: CacheConfig,
        on_close: Callable[[], None] | None = None,
        *,
        keep_snapshot: bool = True,
        is_open: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self._on_close = on_close
        self._is_open = is_open  # False once the vault started closing (lock): long steps stop
        self.vault_id = store.vault_id
        self.cache_cfg = cache_cfg
        self.lock = threading.RLock()
        self._fp_key = store.keys.subkey(crypto.LABEL_FINGERPRINT)
        self._docs: dict[str, IndexedDoc] = {}
        self.generation = -1
        self._n_frags = 0
        self._n_windows = 0  # turn windows of the live fragments (vectors only)
        self.head: Head | None = None  # the vault head the index reflects (what a snapshot is bound to)
        self.bm25: BM25Index | None = None
        self.keeper: SnapshotKeeper | None = SnapshotKeeper(store, self) if keep_snapshot else None
        self._restore_tried = False
        self.vectors: VectorSpace | None = None  # for the active embedder
        self.source_bytes = 0
        self.closed = False

    # ------------------------------------------------------------------ building

    def _doc_for(self, rec: Record) -> IndexedDoc:
        if getattr(self._fp_key, "wiped", False):
            raise crypto.KeyWiped("the fingerprint key was wiped (the vault was locked)")
        return index_doc(rec, bytes(self._fp_key))

    def refresh(self) -> bool:
        """Bring the index up to the vault's generation. Returns True when anything changed."""
        with self.lock:
            if self.closed:  # never rebuild plaintext after close (lock, eviction)
                raise crypto.KeyWiped("the index was closed (the vault was locked)")
            restored = False
            if self.bm25 is None and self.keeper is not None and not self._restore_tried:
                self._restore_tried = True
                got = self.keeper.restore(doc_from_record)
                if got is not None:
                    self.bm25, self._docs, self.head = got
                    self._n_frags = self.bm25.stats.fragments
                    self._n_windows = sum(_windows_of(d) for d in self._docs.values() if d.windows)
                    self.source_bytes = self.bm25.stats.source_bytes
                    restored = True
            store = self.store
            with store.exclusive():  # generation, head and records of one state
                gen = store.generation
                if gen == self.generation and self.bm25 is not None:
                    return False
                head = store.head
                # A complete snapshot of this very head holds every searchable record as it is:
                # nothing to compare (at 100,000 fragments, 0.1-0.2 s of the first search).
                same = restored and head == self.head and self.keeper is not None and self.keeper.info.get("complete")
                current = None if same else {r.id: r for r in store.latest() if r.searchable}
            if current is None:
                changed: list[Record] = []
                removed: list[str] = []
            else:
                changed = [r for rid, r in current.items() if rid not in self._docs or self._docs[rid].revision != r.revision]
                removed = [rid for rid in self._docs if rid not in current]
            new_docs = {r.id: self._doc_for(r) for r in changed}
            # Caps are checked on what the index would hold, before it is built.
            docs_after = dict(self._docs)
            for rid in removed:
                docs_after.pop(rid, None)
            docs_after.update(new_docs)
            # Counted from the change alone: a refresh costs what changed, not the whole vault.
            old = [self._docs[rid] for rid in removed] + [self._docs[r.id] for r in changed if r.id in self._docs]
            n_frags = self._n_frags - sum(len(d.fragments) for d in old) + sum(len(d.fragments) for d in new_docs.values())
            n_windows = self._n_windows - sum(_windows_of(d) for d in old if d.windows) + sum(
                _windows_of(d) for d in new_docs.values() if d.windows
            )
            size = self.source_bytes - sum(doc_source_bytes(d) for d in old) + sum(doc_source_bytes(d) for d in new_docs.values())
            try:
                check_caps(n_frags, size, self.cache_cfg)
            except CapExceeded:
                if self.generation < 0 and self.bm25 is not None:  # a restored index is not kept over the caps
                    self.bm25.close()
                    self.bm25, self._docs, self._n_frags, self.source_bytes = None, {}, 0, 0
                    self._n_windows = 0
                raise
            if self.bm25 is None:
                self.bm25 = BM25Index(list(docs_after.values()))
            else:
                gone = removed + [r.id for r in changed if r.id in self._docs]
                if gone:
                    old_ids = [fid for rid in gone for fid in self.bm25.frag_ids(rid)]
                    old_ids += [w for fid in old_ids for w in self.window_ids(fid)]
                    if self.vectors is not None:  # before the fragments are released: their keys
                        old_keys = [self.vectors.key_of(self, fid) for fid in old_ids]
                        self.vectors.drop(old_ids, old_keys)
                    self.bm25.remove(gone)
                if new_docs:
                    self.bm25.add(list(new_docs.values()))
            self._docs = docs_after
            self._n_frags = n_frags
            self._n_windows = n_windows
            self.source_bytes = size
            self.generation = gen
            self.head = head
            if self.keeper is not None:
                if restored:
                    self.keeper.caught_up(len(changed), len(removed))
                elif self.keeper.info.get("source") is None:
                    self.keeper.info["source"] = "built"
                self.keeper.start()
            if self.vectors is not None:
                self.vectors.attach(self)
            return True

    # ------------------------------------------------------------------ access

    @property
    def docs(self) -> dict[str, IndexedDoc]:
        return self._docs

    def fragment(self, frag_id: int) -> tuple[IndexedDoc, Fragment]:
        """A live fragment, or a turn window of one by its (negative) vector key."""
        got = self.get_fragment(frag_id)
        if got is None:
            raise KeyError(frag_id)
        return got

    def get_fragment(self, frag_id: int) -> tuple[IndexedDoc, Fragment] | None:
        """The fragment (or turn window), or None once its record was changed or removed (the
        index holds live fragments only: a search that raced a change skips what it found before
        the change)."""
        bm25 = self.bm25
        if bm25 is None:
            return None
        if frag_id >= 0:
            return bm25.fragments.get(frag_id)
        parent, j = window_parent(frag_id)
        got = bm25.fragments.get(parent)
        if got is None:
            return None
        doc, frag = got
        wins = doc.windows[frag.ordinal] if frag.ordinal < len(doc.windows) else ()
        return (doc, wins[j]) if j < len(wins) else None

    def live_frag_ids(self) -> list[int]:
        assert self.bm25 is not None
        return [fid for rid in self._docs for fid in self.bm25.frag_ids(rid)]

    def window_ids(self, frag_id: int) -> list[int]:
        """Vector keys of a live fragment's turn windows (:mod:`memoriesd.index.vectors.windows`)."""
        got = self.bm25.fragments.get(frag_id) if self.bm25 is not None and frag_id >= 0 else None
        if got is None or not got[0].windows:
            return []
        doc, frag = got
        n = len(doc.windows[frag.ordinal]) if frag.ordinal < len(doc.windows) else 0
        return [window_id(frag_id, j) for j in range(n)]

    def live_vector_ids(self, windows: bool) -> list[int]:
        """Keys that should have a vector: every live fragment, then (``windows``) their turn windows."""
        ids = self.live_frag_ids()
        if windows and self._n_windows:
            assert self.bm25 is not None
            ids += [w for rid, doc in self._docs.items() if doc.windows for fid in self.bm25.frag_ids(rid)
                    for w in self.window_ids(fid)]
        return ids

    def n_fragments(self) -> int:
        return self._n_frags

    def n_vectors(self, windows: bool) -> int:
        """How many vectors the live fragments want: one each, plus (``windows``) their turn windows."""
        return self._n_frags + (self._n_windows if windows else 0)

    def check_open(self) -> None:
        """Between the steps of a long build: ``cancelled`` once the vault started closing, so lock
        never waits for a restore to finish."""
        if self.closed or (self._is_open is not None and not self._is_open()):
            raise Cancelled(f"vault {self.store.name} was locked: the operation was cancelled")

    @property
    def snapshot_info(self) -> dict[str, Any]:
        """Where the lexical index came from (``source``: snapshot or built) and what was written."""
        return dict(self.keeper.info) if self.keeper is not None else {"source": "built"}

    def close(self) -> None:
        if self.keeper is not None:
            # First, without self.lock: it stops the background writer (which takes self.lock) and
            # writes once more if due, while the keys are still valid.
            self.keeper.close()
        with self.lock:
            self.closed = True
            if self.bm25 is not None:
                self.bm25.close()
            self.bm25 = None
            self._docs = {}
            self._n_frags = 0
            self._n_windows = 0
            if self.vectors is not None:
                self.vectors.close()
            self.vectors = None
            crypto.wipe(self._fp_key)
        if self._on_close is not None:
            self._on_close()


class _Vaults(Protocol):
    def live(self, vault_id: str) -> LiveVault | None: ...


class _Owner(Protocol):
    @property
    def vaults(self) -> _Vaults: ...


class IndexHost(Protocol):
    """What :func:`restore_after_unlock` uses of the retrieval engine (:class:`memoriesd.rag.engine.RagEngine`)."""

    @property
    def app(self) -> _Owner: ...

    def vault_index(self, vault: LiveVault) -> VaultIndex: ...


def restore_after_unlock(engine: IndexHost, vault_id: str) -> None:
    """Right after unlock, restore the vault's lexical snapshot in a background thread (when it has
    one), so that the first search finds the index loaded, or loading, instead of starting then.

    Holds a background lease (lock waits for it like for any operation; auto-lock does not count
    it as use). Never builds an index from scratch here: without a snapshot nothing happens.
    """
    live = engine.app.vaults.live(vault_id)
    if live is None or not snapshot_path(live.store.dir).exists():
        return

    def run() -> None:
        try:
            live.acquire(touch=False)
        except MemoriesError:
            return
        try:
            engine.vault_index(live)
        except Exception as exc:  # noqa: BLE001 - the first search reports whatever this hit
            log.info("vault %s: the lexical index was not restored at unlock (%s)", vault_id, type(exc).__name__)
        finally:
            live.release(touch=False)

    threading.Thread(target=run, name=f"memoriesd-restore-{vault_id}", daemon=True).start()


def compact_lexical(store: VaultStore, vault_index: VaultIndex | None) -> dict[str, str]:
    """After ``vault compact``: the lexical snapshot is rewritten from the purged index bound to the
    new head, or removed (a snapshot of the old log may hold rows of what compaction dropped)."""
    if vault_index is not None and vault_index.keeper is not None and not vault_index.closed:
        return {"lexical_snapshot": vault_index.keeper.after_compaction()}
    return {"lexical_snapshot": "removed" if remove_snapshot(store.dir) else "none"}


class IndexCache:
    """Which unlocked vaults keep a search index: at most ``max_vaults``, least recently used evicted.

    The index itself belongs to the vault's :class:`~memoriesd.vault.live.LiveVault` (attachment
    ``"index"``), so lock closes it in the vault's one close order. Eviction *detaches* it: closed
    at once when that vault has no operation running, else when its last operation ends, so a
    search or an embedding pass never sees its index closed under it.
    """

    #: Indexes kept by one process. The daemon runs each unlocked vault in its own process, so this
    #: matters only where one process serves several vaults (tests set it on the instance).
    max_vaults = 2

    def __init__(self, cache_cfg: CacheConfig) -> None:
        self.cfg = cache_cfg
        self._lock = threading.Lock()
        self._items: OrderedDict[str, LiveVault] = OrderedDict()

    def get(self, live: LiveVault) -> VaultIndex:
        """The vault's index (built empty on first use; ``vault_locked`` once it is closing)."""

        def forget() -> None:
            with self._lock:
                if self._items.get(live.vault_id) is live:
                    del self._items[live.vault_id]

        idx = live.attachment(
            INDEX, lambda: VaultIndex(live.store, self.cfg, on_close=forget, is_open=lambda: live.is_open)
        )
        victims: list[LiveVault] = []
        with self._lock:
            self._items[live.vault_id] = live
            self._items.move_to_end(live.vault_id)
            while len(self._items) > max(1, self.max_vaults):
                _, old = self._items.popitem(last=False)
                victims.append(old)
        for old in victims:
            closed = old.detach(INDEX)
            log.info("index of vault %s evicted from the cache%s", old.vault_id, "" if closed else " (closes when idle)")
        return idx

    def cached_ids(self) -> list[str]:
        with self._lock:
            return list(self._items)


INDEX = "index"
