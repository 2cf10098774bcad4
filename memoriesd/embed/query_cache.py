"""Query vectors kept in daemon memory: a repeated search does not embed its query again.

An LRU of at most ``QUERY_CACHE_ITEMS`` vectors (:mod:`memoriesd.embed.service`), each used for ``QUERY_CACHE_SECONDS``
after it was computed. The key is the vault, the embedder's identity (weights, prompts,
dimensions, or the remote service and model), its query prompt and the query text: a different
model or prompt never reuses a vector. Entries live only in memory (never sealed, never written)
and a vault's entries are dropped when it locks (:meth:`QueryCache.forget_vault`, registered with
the vault manager's lock listeners), so lock, auto-lock and restart forget every query it saw.
``memory forget`` clears the whole cache. A hit is a dictionary lookup under a lock (micro-seconds:
``bench/bench_query_cache.py``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..embed.types import Embedder

Key = tuple[str, str, str, str]


def cache_key(vault_id: str, embedder: Embedder, text: str) -> Key:
    """What a query vector depends on: the vault, the embedder's identity and query prompt, the text."""
    profile = embedder.profile
    prompt = profile.query_prompt if profile is not None else ""
    return (vault_id, str(embedder.identity), prompt, text)


class QueryCache:
    """A bounded, time-limited LRU of query vectors (thread-safe)."""

    def __init__(self, max_items: int, ttl_seconds: float) -> None:
        self.max_items = max(0, int(max_items))
        self.ttl = float(ttl_seconds)
        self._lock = threading.Lock()
        self._items: OrderedDict[Key, tuple[float, np.ndarray]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_items > 0 and self.ttl > 0

    def get(self, key: Key) -> np.ndarray | None:
        """The cached vector (read-only), or None when absent or older than the time limit."""
        if not self.enabled:
            return None
        now = time.monotonic()
        with self._lock:
            got = self._items.get(key)
            if got is None or now - got[0] > self.ttl:
                if got is not None:
                    del self._items[key]
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return got[1]

    def put(self, key: Key, vector: np.ndarray) -> None:
        if not self.enabled:
            return
        vec = np.array(vector, dtype=np.float32, copy=True)
        vec.setflags(write=False)  # shared by every hit: nobody may change it in place
        with self._lock:
            self._items[key] = (time.monotonic(), vec)
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def forget_vault(self, vault_id: str) -> None:
        """Drop the entries of one vault (its lock)."""
        with self._lock:
            for key in [k for k in self._items if k[0] == vault_id]:
                del self._items[key]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


__all__ = ["QueryCache", "cache_key"]
