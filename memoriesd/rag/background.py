"""The background indexer: one low-priority worker that embeds missing fragments, one vault at a time.

With a local model available and ``[index] background = true`` (the default), a vault is queued
after ``rag ingest``, a record change and unlock. The worker embeds its missing fragments in small
chunks; each chunk takes a lease on the vault (so lock waits for at most one chunk, and cancels the
rest), yields to query embedding (``VectorView.ensure(..., background=True)``) and is sealed
to disk as every batch is. It does not count as use of the vault: auto-lock still locks an idle
vault, which pauses its job until the next unlock. A vault change during a chunk only drops that
chunk; the job goes on with the new content. ``rag index`` attaches to the job instead of running
a second pass beside it; ``rag status`` shows its state, rate and ETA.

Which vault goes first — here, when one process queues several vaults, and in the model process,
which serves every vault's process — is decided by one policy, :mod:`memoriesd.embed.schedule`:
each chunk tells the model process the vault's backlog and how long ago it was used.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..embed.schedule import BACKGROUND, FOREGROUND, Hint, hinted, rank
from ..errors import Cancelled, MemoriesError, VaultLocked
from ..index.upkeep import LexicalUpkeep
from .vector_view import ViewEngine

if TYPE_CHECKING:
    from ..index.caches import VaultIndex
    from ..vault.live import LiveVault
    from ..vault.manager import VaultManager

log = logging.getLogger("memoriesd.indexing")

#: Fragments per background chunk: small, so lock and queries wait little behind it.
CHUNK_FRAGMENTS = 8
#: A chunk is the :data:`CHUNK_FRAGMENTS` of the first this-many missing fragments whose token counts are
#: closest (:func:`like_lengths`): in fragment order a chunk of 8 padded EmbeddingGemma's input by 38%
#: (SciFact) and 58% (XQuAD-zh), like lengths by 3.5% and 6.5% (docs/benchmarks.md "Embedding throughput").
CHUNK_WINDOW = 64
#: Tests only: while the file this variable names exists, the worker holds each chunk before it embeds
#: (its job stays "running", its lease held, lock and stop still cancel it), so a test can search, lock
#: or auto-lock a vault mid-indexing whatever the machine's speed. Never set it otherwise.
HOLD_ENV = "MEMORIES_TEST_HOLD_BACKGROUND"


class IndexerHost(Protocol):
    """What the indexer uses of the daemon's app: its vaults' unlock and lock events."""

    @property
    def vaults(self) -> VaultManager: ...


class IndexerEngine(ViewEngine, Protocol):
    """What the indexer uses of the retrieval engine (:class:`memoriesd.rag.engine.RagEngine`): the
    vector recipe's parts and each vault's index."""

    def vault_index(self, vault: LiveVault) -> VaultIndex: ...


class _Work:
    """The request context of a background chunk: its lease and its stop checks."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.checks: list[Callable[[], None]] = []
        self.leases: list[Callable[[], None]] = []

    def check_cancelled(self) -> None:
        if self.stop.is_set():
            raise Cancelled("the daemon is stopping")
        for check in self.checks:
            check()

    def release(self) -> None:
        while self.leases:
            self.leases.pop()()


@dataclass
class Job:
    """What ``rag status`` says about a vault's background embedding."""

    vault_id: str
    state: str = "queued"  # queued | running | paused | done | failed
    embedded: int = 0  # fragments with a vector (of total)
    total: int = 0
    skipped: int = 0
    rate: float | None = None  # fragments per second (recent)
    error: str | None = None
    started: float = 0.0

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.embedded - self.skipped)

    @property
    def eta_seconds(self) -> float | None:
        if self.state not in ("running", "queued") or not self.rate:
            return None
        return round(self.remaining / self.rate, 1)

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "embedded": self.embedded,
            "total": self.total,
            "skipped": self.skipped,
            "rate": None if self.rate is None else round(self.rate, 2),
            "eta_seconds": self.eta_seconds,
            "error": self.error,
        }


class BackgroundIndexer:
    """The one background worker of a daemon (see the module docstring)."""

    def __init__(self, app: IndexerHost, engine: IndexerEngine) -> None:
        self.app = app
        self.engine = engine
        self._cond = threading.Condition()
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._urgent: set[str] = set()  # queued by `rag index`: someone waits for it
        self._lengths: dict[str, LengthCache] = {}  # token counts of the fragments a job has looked at
        self._jobs: dict[str, Job] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # After a change or an unlock, the lexical index and its snapshot are brought up to date in
        # the background whatever the model (memoriesd.index.upkeep): never on the first search.
        self.lexical = LexicalUpkeep(app.vaults.live, engine.vault_index)
        app.vaults.on_unlock(self.request)
        app.vaults.on_lock(self._paused)

    # ------------------------------------------------------------------ requests

    def enabled(self) -> bool:
        return bool(self.engine.config.index.background) and self.engine.embedding.choice().source == "local"

    def request(self, vault_id: str, *, first: bool = False) -> None:
        """Queue ``vault_id`` (``first``: ahead of the others, for `rag index`)."""
        self.lexical.request(vault_id)
        if not self.enabled():
            return
        with self._cond:
            job = self._jobs.get(vault_id)
            if job is None or job.state in ("done", "paused", "failed"):
                self._jobs[vault_id] = job = Job(vault_id, embedded=job.embedded if job else 0, total=job.total if job else 0)
            self._queue[vault_id] = None
            if first:
                self._urgent.add(vault_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="memoriesd-background-index", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def job(self, vault_id: str) -> Job | None:
        with self._cond:
            return self._jobs.get(vault_id)

    def active(self, vault_id: str) -> bool:
        job = self.job(vault_id)
        return job is not None and job.state in ("queued", "running")

    def wait(self, vault_id: str, timeout: float) -> Job | None:
        """Until the vault's job leaves queued/running, or ``timeout`` seconds; the job as it is then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                job = self._jobs.get(vault_id)
                if job is None or job.state not in ("queued", "running"):
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    return job
                self._cond.wait(min(left, 0.5))

    def stop(self) -> None:
        self._stop.set()
        self.lexical.stop()
        with self._cond:
            self._cond.notify_all()

    def _paused(self, vault_id: str) -> None:
        with self._cond:
            self._queue.pop(vault_id, None)
            self._urgent.discard(vault_id)
            self._lengths.pop(vault_id, None)
            job = self._jobs.get(vault_id)
            if job is not None and job.state in ("queued", "running"):
                job.state = "paused"
                job.rate = None
            self._cond.notify_all()

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait(5.0)
                if self._stop.is_set():
                    return
                vault_id = self._next()
            try:
                finished = self._step(vault_id)
            except Exception:  # never let the worker die: the next request restarts work
                log.exception("background indexing of vault %s failed", vault_id)
                finished = True
                self._set(vault_id, state="failed", error="an internal error: see the daemon log")
            if finished:
                with self._cond:
                    self._queue.pop(vault_id, None)
                    self._urgent.discard(vault_id)
                    self._cond.notify_all()

    def _hint(self, vault_id: str, backlog: int | None = None) -> Hint:
        """The schedule's view of a queued vault: `rag index` waits for it, its backlog, its last use."""
        live = self.app.vaults.live(vault_id)
        idle = time.monotonic() - live.last_used if live is not None else float("inf")
        if backlog is None:
            job = self._jobs.get(vault_id)
            backlog = job.remaining if job is not None and job.total else 0  # not counted yet: one chunk counts it
        return Hint(FOREGROUND if vault_id in self._urgent else BACKGROUND, backlog, idle)

    def _next(self) -> str:
        """Caller holds ``_cond``. The queued vault to work on next, by :func:`memoriesd.embed.schedule.rank`
        (chosen again after every chunk, so a vault queued later can go first)."""
        order = list(self._queue)
        return min(order, key=lambda v: (rank(self._hint(v)), order.index(v)))

    def _set(self, vault_id: str, **fields: object) -> None:
        with self._cond:
            job = self._jobs.setdefault(vault_id, Job(vault_id))
            for k, v in fields.items():
                setattr(job, k, v)
            self._cond.notify_all()

    def _step(self, vault_id: str) -> bool:
        """Embed one chunk of ``vault_id``. True when its job is over (done, paused or failed)."""
        live = self.app.vaults.live(vault_id)
        if live is None:
            self._paused(vault_id)
            return True
        try:
            live.acquire(touch=False)  # not "use": auto-lock still sees the vault as idle
        except VaultLocked:
            self._paused(vault_id)
            return True
        ctx = _Work(self._stop)
        ctx.leases.append(lambda: live.release(touch=False))
        ctx.checks.append(live.check)
        try:
            return self._chunk(vault_id, live, ctx)
        except (VaultLocked, Cancelled):
            self._paused(vault_id)
            return True
        except MemoriesError as exc:
            log.warning("background indexing of vault %s stopped: %s", vault_id, exc.code)
            self._set(vault_id, state="failed", error=exc.message, rate=None)
            return True
        finally:
            ctx.release()

    def _chunk(self, vault_id: str, live: LiveVault, ctx: _Work) -> bool:
        """Record the job's counts, then embed up to :data:`CHUNK_FRAGMENTS` missing fragments
        (yielding to foreground embeddings) on the vector recipe. True when the job is over."""
        from ..rag.vector_view import open_view

        engine = self.engine
        store = live.store
        view = open_view(engine, store, engine.vault_index(live))
        missing = len(view.missing())
        total, skipped = view.total, view.skipped
        job = self.job(vault_id)
        if job is not None and job.state != "running":
            self._set(vault_id, state="running", started=time.monotonic(), error=None)
        self._set(vault_id, total=total, embedded=total - missing - skipped, skipped=skipped)
        if not missing:
            self._lengths.pop(vault_id, None)
            self._set(vault_id, state="done", rate=None)
            log.info("background indexing of vault %s done (%d fragments)", vault_id, total)
            return True
        _hold_for_tests(ctx)
        t0 = time.monotonic()
        with self._cond:
            hint = self._hint(vault_id, backlog=max(0, missing - CHUNK_FRAGMENTS))
        cache = self._lengths.setdefault(vault_id, LengthCache())
        todo = like_lengths(cache.lengths(view.missing()[:CHUNK_WINDOW], view.idx, view.embedder), CHUNK_FRAGMENTS)
        try:
            with hinted(hint):  # read by the model process's client: this vault's place in the queue
                n = view.embed(todo, ctx, background=True)
        except Cancelled:
            if not live.is_open or self._stop.is_set():
                self._paused(vault_id)
                return True
            return False  # the vault changed under the chunk: go on with the new content
        dt = max(time.monotonic() - t0, 1e-6)
        with self._cond:
            job = self._jobs[vault_id]
            recent = n / dt
            job.rate = recent if job.rate is None else 0.7 * job.rate + 0.3 * recent
            job.embedded = min(job.total, job.embedded + n)
            self._cond.notify_all()
        return False


class LengthCache:
    """Token counts of a vault's fragments, asked of the model once per fragment (by id), so the
    background indexer can put fragments of like length in one batch."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def lengths(self, window: list[int], idx: VaultIndex, embedder: object) -> dict[int, int]:
        todo = [fid for fid in window if fid not in self.counts]
        if todo:
            texts = []
            for fid in todo:
                got = idx.get_fragment(fid)
                texts.append(f"{got[0].title or ''} {got[1].text}" if got is not None else "")
            count = getattr(embedder, "count_tokens_many", None)  # a local model (in process or the model process)
            if count is not None:
                self.counts.update(zip(todo, count(texts), strict=True))
            else:  # characters stand in for tokens
                self.counts.update((fid, len(t)) for fid, t in zip(todo, texts, strict=True))
        return {fid: self.counts[fid] for fid in window}


def like_lengths(lengths: dict[int, int], count: int) -> list[int]:
    """The ``count`` fragments of ``lengths`` (id -> tokens) that pad least as one batch: the run of
    ``count`` neighbours in length order whose padding (``count x longest - sum``) is smallest."""
    order = sorted(lengths, key=lambda fid: (lengths[fid], fid))
    if len(order) <= count:
        return order
    runs = range(len(order) - count + 1)
    best = min(runs, key=lambda j: (count * lengths[order[j + count - 1]] - sum(lengths[f] for f in order[j : j + count]), j))
    return sorted(order[best : best + count])


def _hold_for_tests(ctx: _Work) -> None:
    """See :data:`HOLD_ENV`: a test's gate, checked for lock and stop while it is closed."""
    path = os.environ.get(HOLD_ENV)
    while path and os.path.exists(path):
        ctx.check_cancelled()
        ctx.stop.wait(0.02)


__all__ = ["BackgroundIndexer", "Job", "CHUNK_FRAGMENTS"]
