"""Who embeds next: the one place the embedding queue's fairness policy is written down.

Every vault's process sends its embedding work to the one model process
(:mod:`memoriesd.workers.model`); this module decides the order in which the model process runs it.
The policy, in order of precedence:

1. **A query never waits for documents.** Query embeddings (a search's vector) run at once, beside
   whatever batch is running (onnxruntime's ``run`` is thread-safe).
2. **Foreground documents before background ones.** A batch someone waits for (``rag index``, a
   search's on-demand embedding, a fact compared with the stored ones) goes before any background
   indexing batch.
3. **The vault in use first.** Among background batches, a vault that was used (searched, written)
   within :data:`IN_USE_SECONDS` goes before one nobody touched.
4. **Small before large.** Then the vault with fewer fragments left to embed goes first, so a
   2,000-fragment vault is indexed before a 15,000-fragment one takes the model for half an hour.
5. **Then first come, first served.**

Documents run one batch at a time (two batches at once on two cores only share them, and each
finishes later). A vault's background work arrives as a stream of small batches with gaps between
them (the vault process seals each batch before it sends the next), so the queue remembers each
vault's **claim** (its backlog and rank) between batches: a lower-ranked vault's batch waits while
a higher-ranked vault's claim is fresh (its last batch ended less than :data:`CLAIM_SECONDS` ago and
it said fragments were left). A claim ends with the batch that leaves nothing to embed, or goes
stale when its vault stops sending (locked, failed, daemon stopping).

The vault processes say what the policy needs with each request (:class:`Hint`): the lane, the
backlog before the batch and how long ago a user last used the vault — never any content. The
background indexer sets the hint (:func:`hinted`); the model process's client reads it
(:func:`current_hint`). :class:`memoriesd.rag.background.BackgroundIndexer` orders its own queue
(several vaults in one process) with the same :func:`rank`.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: A vault used this recently (searched, written) counts as in use: its background batches go first.
IN_USE_SECONDS = 300.0
#: A vault's claim on the model between two of its background batches stays fresh this long.
CLAIM_SECONDS = 10.0

QUERY, FOREGROUND, BACKGROUND = "query", "foreground", "background"
LANES = (QUERY, FOREGROUND, BACKGROUND)


@dataclass(frozen=True)
class Hint:
    """What a vault process says about one embedding request (no content)."""

    lane: str = FOREGROUND
    backlog: int = 0  # fragments the vault will still have to embed after this batch (0: its last)
    idle_seconds: float = 0.0  # since a user last used the vault


def rank(hint: Hint) -> tuple[int, int, int]:
    """The policy (see the module docstring) as a sort key: lower runs first; ties go in arrival order."""
    lane = LANES.index(hint.lane) if hint.lane in LANES else LANES.index(FOREGROUND)
    in_use = 0 if hint.idle_seconds < IN_USE_SECONDS else 1
    return (lane, in_use, max(0, hint.backlog))


_hint: contextvars.ContextVar[Hint | None] = contextvars.ContextVar("memories_embed_hint", default=None)


@contextlib.contextmanager
def hinted(hint: Hint) -> Iterator[None]:
    """Embedding requests made inside this block (in this thread) carry ``hint``."""
    token = _hint.set(hint)
    try:
        yield
    finally:
        _hint.reset(token)


def current_hint() -> Hint | None:
    return _hint.get()


@dataclass
class _Claim:
    """A vault's place in the queue between its background batches."""

    hint: Hint
    seen: float  # monotonic: when its last batch arrived or ended


@dataclass
class _Waiter:
    vault: str
    hint: Hint
    arrived: float
    seq: int


class EmbedQueue:
    """The model process's queue of document batches (queries pass by it: policy rule 1).

    ``with queue.turn(vault, hint):`` blocks until the batch may run, by :func:`rank` and the
    fresh claims of other vaults; the batch runs inside the block. :meth:`used` records a query or
    foreground request of a vault: its waiting and later background batches count as in use from
    then on (a search while the vault indexes moves it ahead of an idle vault at once).
    """

    def __init__(
        self, claim_seconds: float = CLAIM_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.claim_seconds = claim_seconds
        self.clock = clock  # tests pass their own, to let a claim lapse without waiting for it
        self._cond = threading.Condition()
        self._running = False
        self._waiting: list[_Waiter] = []
        self._claims: dict[str, _Claim] = {}
        self._used: dict[str, float] = {}  # vault -> monotonic time of its last query / foreground request
        self._seq = itertools.count()

    def used(self, vault: str) -> None:
        with self._cond:
            self._used[vault] = self.clock()
            self._cond.notify_all()

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def _key(self, vault: str, hint: Hint, since: float, now: float) -> tuple[int, int, int]:
        """``hint``'s rank now: it was given at ``since``; a later use of the vault counts too."""
        idle = hint.idle_seconds + (now - since)
        last = self._used.get(vault)
        if last is not None:
            idle = min(idle, now - last)
        return rank(Hint(hint.lane, hint.backlog, idle))

    def _may_run(self, me: _Waiter, now: float) -> bool:
        if self._running:
            return False
        mine = (self._key(me.vault, me.hint, me.arrived, now), me.seq)
        if any(
            (self._key(w.vault, w.hint, w.arrived, now), w.seq) < mine for w in self._waiting if w is not me
        ):
            return False
        if me.hint.lane != BACKGROUND:
            return True
        for vault in [v for v, c in self._claims.items() if now - c.seen > self.claim_seconds]:
            del self._claims[vault]  # its vault stopped sending: locked, failed or done elsewhere
        return not any(
            self._key(v, c.hint, c.seen, now) < mine[0] for v, c in self._claims.items() if v != me.vault
        )

    @contextlib.contextmanager
    def turn(self, vault: str, hint: Hint) -> Iterator[None]:
        now = self.clock()
        me = _Waiter(vault, hint, now, next(self._seq))
        with self._cond:
            if hint.lane == BACKGROUND:
                self._claims[vault] = _Claim(hint, now)
            else:
                self._used[vault] = now
            self._waiting.append(me)
            while not self._may_run(me, self.clock()):
                # Woken when a batch ends; the timeout lets a stale claim lapse.
                self._cond.wait(max(0.05, self.claim_seconds / 4))
            self._waiting.remove(me)
            self._running = True
        try:
            yield
        finally:
            with self._cond:
                self._running = False
                if hint.lane == BACKGROUND:
                    if hint.backlog > 0:  # more to come: its place stays held while it seals this batch
                        now = self.clock()
                        idle = hint.idle_seconds + (now - me.arrived)
                        self._claims[vault] = _Claim(Hint(BACKGROUND, hint.backlog, idle), now)
                    else:
                        self._claims.pop(vault, None)
                self._cond.notify_all()


__all__ = [
    "BACKGROUND",
    "CLAIM_SECONDS",
    "EmbedQueue",
    "FOREGROUND",
    "Hint",
    "IN_USE_SECONDS",
    "QUERY",
    "current_hint",
    "hinted",
    "rank",
]
