"""Lexical upkeep: what a large change leaves to do is done in the background, never on a search.

A search needs the vault's lexical index built (every record fragmented and segmented into FTS5
rows) or restored from the sealed snapshot (:mod:`memoriesd.index.keeper`). Before this, a large
``rag ingest`` left all of it to the first search: nothing built the index until a query came, so
no snapshot was written either, and the first search after the next unlock rebuilt 100,000
fragments (6-9 s). Now, after each change (``rag ingest``, a record written, a watched folder's
sync) and after unlock, once the vault has been quiet for :data:`SETTLE_SECONDS`:

- when the vault's log holds at least :data:`MIN_BEHIND_ENTRIES` entries that the snapshot on disk
  does not cover (or there is no snapshot and the log has that many), the index is brought up to
  date (restored, or built), its pending rows are written (:meth:`BM25Index.flush`, in chunks that
  check for lock), and the snapshot is written: the next unlock restores it and the first search
  applies nothing;
- a smaller change costs the next unlock's restore little to catch up, so it is left alone.

The work holds a background lease (lock waits for it and cancels it between chunks; auto-lock does
not count it as use). A failure is logged as its kind only (never content) and costs nothing but
the speed of the next first search.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import MemoriesError
from ..text.segment import DEFAULT
from ..vault import crypto
from ..vault.live import LiveVault
from .caches import INDEX, VaultIndex
from .snapshot import snapshot_head, version_tag

log = logging.getLogger("memoriesd.index")

#: Quiet time after the last change before the upkeep runs (an ingest's groups settle).
SETTLE_SECONDS = 2.0
#: Log entries not covered by the snapshot on disk before the upkeep is worth running.
MIN_BEHIND_ENTRIES = 200

Live = Callable[[str], "LiveVault | None"]
IndexOf = Callable[[LiveVault], VaultIndex]


def entries_behind(live: LiveVault, index: VaultIndex | None) -> int:
    """Log entries of the vault's current epoch that its snapshot on disk does not cover (all of
    them when there is no usable snapshot)."""
    head = live.store.head
    known = index.keeper.on_disk if index is not None and index.keeper is not None else None
    snap = known if known is not None else snapshot_head(live.store.dir, version_tag(DEFAULT))
    if snap is None or snap.epoch != head.epoch or snap.count > head.count:
        return head.count
    return head.count - snap.count


class LexicalUpkeep:
    """One background thread per process that keeps the vaults' lexical snapshots current (see
    the module docstring). ``live``: an unlocked vault by id (None once locked); ``index_of``: its
    refreshed index (:meth:`memoriesd.rag.engine.RagEngine.vault_index`)."""

    def __init__(self, live: Live, index_of: IndexOf) -> None:
        self._live = live
        self._index_of = index_of
        self._cond = threading.Condition()
        # vault id -> when its last change was seen, and the store's generation then
        self._due: dict[str, tuple[float, int]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seen = -1  # the generation of the vault _next returned, when its change was seen
        self.runs = 0  # upkeep passes that wrote a snapshot (status, tests)

    def request(self, vault_id: str) -> None:
        """A change to ``vault_id`` (or its unlock): look at it once it has been quiet a while."""
        live = self._live(vault_id)
        generation = live.store.generation if live is not None else -1
        with self._cond:
            self._due[vault_id] = (time.monotonic(), generation)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="memoriesd-lexical-upkeep", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def _next(self) -> str | None:
        """The vault whose quiet time is over (waits for one); None when stopping."""
        with self._cond:
            while not self._stop.is_set():
                now = time.monotonic()
                ready = [v for v, (t, _) in self._due.items() if now - t >= SETTLE_SECONDS]
                if ready:
                    self._seen = self._due.pop(ready[0])[1]
                    return ready[0]
                wait = min((SETTLE_SECONDS - (now - t) for t, _ in self._due.values()), default=None)
                self._cond.wait(wait if wait is not None else 30.0)
        return None

    def _run(self) -> None:
        while (vault_id := self._next()) is not None:
            live = self._live(vault_id)
            if live is not None and live.store.generation != self._seen:
                self.request(
                    vault_id
                )  # still changing (a long ingest writes group after group): not quiet yet
                continue
            try:
                self.keep(vault_id)
            except Exception as exc:  # noqa: BLE001 - never let the thread die: the next change retries
                log.warning("vault %s: lexical upkeep failed (%s)", vault_id, type(exc).__name__)

    def keep(self, vault_id: str) -> bool:
        """Bring the vault's index and snapshot up to date when worth it (True when a snapshot was written)."""
        live = self._live(vault_id)
        built = live.peek(INDEX) if live is not None else None
        if (
            live is None
            or entries_behind(live, built if isinstance(built, VaultIndex) else None) < MIN_BEHIND_ENTRIES
        ):
            return False
        try:
            live.acquire(touch=False)  # not "use": auto-lock still sees the vault as idle
        except MemoriesError:
            return False
        try:
            t0 = time.perf_counter()
            index = self._index_of(live)  # restored and caught up, or built
            bm25, keeper = index.bm25, index.keeper
            if bm25 is None or keeper is None:
                return False
            bm25.flush(index.check_open)
            index.check_open()
            wrote = keeper.write("ingest", if_due=True)
            if wrote:
                self.runs += 1
                log.info(
                    "vault %s: lexical upkeep after a change: index ready and snapshot written in %.2f s",
                    vault_id,
                    time.perf_counter() - t0,
                )
            return wrote
        except (MemoriesError, crypto.KeyWiped) as exc:  # locked meanwhile, over the caps, cancelled
            log.info(
                "vault %s: lexical upkeep stopped (%s)", vault_id, getattr(exc, "code", type(exc).__name__)
            )
            return False
        finally:
            live.release(touch=False)


__all__ = ["LexicalUpkeep", "MIN_BEHIND_ENTRIES", "SETTLE_SECONDS", "entries_behind"]
