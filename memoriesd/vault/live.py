"""The one owner of an unlocked vault: its store, what is derived from it, and its keys.

A :class:`LiveVault` exists from unlock (or create) to lock. Everything that holds plaintext or
key material for the vault hangs off it: the :class:`~memoriesd.vault.store.VaultStore` (records
and the vault key) and *attachments* (the search index with its vectors and subkeys, the recall
counters), each built only while the vault is open. It is what :meth:`VaultManager.use
<memoriesd.vault.manager.VaultManager.use>` hands a request: the store, the purpose keys
(:attr:`LiveVault.keys`: sealers and subkeys per label, never the vault key) and the vault's named
locks (:meth:`LiveVault.hold`, always taken in :class:`VaultLock` order).

Lifecycle: ``open`` → ``closing`` → ``closed``, one way. Every operation on the vault holds a
*lease* (:meth:`LiveVault.acquire` / :meth:`LiveVault.release`, or :meth:`LiveVault.use`). Closing
(lock, auto-lock, delete, shutdown) follows one order:

1. stop new work: no new lease, no new attachment (``vault_locked``);
2. cancel in-flight work: :meth:`check` raises ``cancelled`` at the next step of a long operation,
   then wait until every lease is released (bounded by ``drain_seconds``);
3. run the close hooks (flush what must be written while the key is still valid);
4. close the attachments, newest first (indexes drop plaintext, sealers wipe subkeys);
5. close the store: wipe the vault key last.

A key used after it was wiped raises :class:`~memoriesd.vault.crypto.KeyWiped` instead of sealing
under zeros, so even an operation that outlives the drain bound can neither read nor write.
An attachment can also be *detached* alone (index eviction): it closes at once when the vault has
no lease, else when the last lease is released.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from ..errors import Cancelled, Internal, VaultLocked
from .keys import VaultKeys
from .store import VaultStore

log = logging.getLogger("memoriesd.vault")

OPEN, CLOSING, CLOSED = "open", "closing", "closed"
DRAIN_SECONDS = 60.0


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


class LeaseScope(Protocol):
    """What a lease is held for (a request, a background job): it releases its leases when it
    ends and runs its checks between the steps of long work."""

    @property
    def leases(self) -> list[Callable[[], None]]: ...

    @property
    def checks(self) -> list[Callable[[], None]]: ...


class VaultLock(enum.IntEnum):
    """The named locks of one vault, in the one order a thread may take them (lower first).

    They serialise read-check-write sequences that span more than one store commit; the store's
    own lock is held only inside :class:`~memoriesd.vault.store.VaultStore` methods.
    """

    CAPTURE = 1  # a conversation's turns: capture, extraction, conversation summaries
    FACTS = 2  # facts: remember, forget, prune, summaries that replace facts
    INGEST = 3  # documents: one ingest at a time


_held = threading.local()  # per thread: {vault_id: [VaultLock, ...]} taken through LiveVault.hold


def locked_error(name: str) -> VaultLocked:
    return VaultLocked(f"vault {name} is locked: run `memories vault unlock {name}`")


class LiveVault:
    """An unlocked vault and everything derived from it (see the module docstring)."""

    def __init__(self, store: VaultStore) -> None:
        self.store = store
        self.vault_id = store.vault_id
        self.name = store.name
        self.state = OPEN
        self._stopping = False  # a lock is coming: long work stops at its next check (stop_work)
        self.last_used = time.monotonic()
        self._cond = threading.Condition(threading.Lock())
        self._leases = 0
        self._untouched = 0  # leases held by background work (auto-lock does not wait for them)
        self._attachments: dict[str, Closeable] = {}
        self._detach_when_idle: set[str] = set()
        self._close_hooks: list[Callable[[LiveVault], None]] = []
        self._locks = {lock: threading.Lock() for lock in VaultLock}

    # ------------------------------------------------------------------ leases

    @property
    def leases(self) -> int:
        """Leases of requests (background work excluded): auto-lock waits until none is held."""
        with self._cond:
            return self._leases - self._untouched

    def acquire(self, *, touch: bool = True) -> None:
        """Take a lease, or ``vault_locked`` when the vault is closing or closed.

        ``touch=False`` (background work) does not count as use for auto-lock.
        """
        with self._cond:
            if self.state != OPEN:
                raise locked_error(self.name)
            self._leases += 1
            if touch:
                self.last_used = time.monotonic()
            else:
                self._untouched += 1

    def release(self, *, touch: bool = True) -> None:
        """Give back a lease taken with the same ``touch``."""
        idle: list[Closeable] = []
        with self._cond:
            self._leases -= 1
            if touch:
                self.last_used = time.monotonic()
            else:
                self._untouched -= 1
            if self._leases == 0:
                idle = [self._attachments.pop(n) for n in sorted(self._detach_when_idle) if n in self._attachments]
                self._detach_when_idle.clear()
                self._cond.notify_all()
        for item in idle:
            _close_quietly(item, self.vault_id)

    @property
    def keys(self) -> VaultKeys:
        """Sealers and subkeys of this vault per purpose label (see :mod:`.keys`)."""
        return self.store.keys

    @contextlib.contextmanager
    def use(self) -> Iterator[VaultStore]:
        self.acquire()
        try:
            yield self.store
        finally:
            self.release()

    def check(self) -> None:
        """For long operations between steps: ``cancelled`` once the vault started closing (or a
        lock was announced: :meth:`stop_work`)."""
        if self.state != OPEN or self._stopping:
            raise Cancelled(f"vault {self.name} was locked: the operation was cancelled")

    def stop_work(self) -> None:
        """A lock is on its way (a vault process told to lock): from now on a long operation stops at
        its next check, so a batch that answers before the close begins is not kept either."""
        self._stopping = True

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    @contextlib.contextmanager
    def hold(self, *locks: VaultLock, check: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the named locks ``locks``, taken in :class:`VaultLock` order whatever order they are
        given in. Taking a lock while this thread holds one of this vault that comes later (or the
        same one) is refused with ``internal``: that order is what keeps two threads from deadlocking.
        ``check`` (background work): called while waiting, so a stop or a lock ends the wait.
        """
        wanted = sorted(set(locks))
        by_vault: dict[str, list[VaultLock]] = _held.__dict__.setdefault("by_vault", {})
        mine = by_vault.setdefault(self.vault_id, [])
        if wanted and mine and max(mine) >= wanted[0]:
            raise Internal(f"lock order: {wanted[0].name} taken while holding {max(mine).name}")
        taken: list[threading.Lock] = []
        try:
            for name in wanted:
                lock = self._locks[name]
                if check is None:
                    lock.acquire()
                else:
                    while not lock.acquire(timeout=0.2):
                        check()
                taken.append(lock)
            mine.extend(wanted)
            try:
                yield
            finally:
                del mine[len(mine) - len(wanted) :]
        finally:
            for lock in reversed(taken):
                lock.release()
            if not mine:
                by_vault.pop(self.vault_id, None)

    # ------------------------------------------------------------------ attachments

    def attachment(self, name: str, factory: Callable[[], T]) -> T:
        """The attachment ``name``, built by ``factory`` on first use while the vault is open.

        The factory runs under the vault's state lock, so it must be cheap (no I/O-heavy build);
        a closing vault never gets a new attachment.
        """
        with self._cond:
            if self.state != OPEN:
                raise locked_error(self.name)
            item = self._attachments.get(name)
            if item is None:
                item = factory()
                self._attachments[name] = item
            self._detach_when_idle.discard(name)
            return item  # type: ignore[return-value]

    def peek(self, name: str) -> Closeable | None:
        with self._cond:
            return self._attachments.get(name) if self.state == OPEN else None

    def detach(self, name: str) -> bool:
        """Close attachment ``name`` now if the vault has no lease, else when the last is released.

        Returns True when it was closed now.
        """
        with self._cond:
            if name not in self._attachments:
                return False
            if self._leases:
                self._detach_when_idle.add(name)
                return False
            item = self._attachments.pop(name)
        _close_quietly(item, self.vault_id)
        return True

    def on_close(self, hook: Callable[[LiveVault], None]) -> None:
        """Run ``hook`` during close, after in-flight work ended and before anything is wiped."""
        with self._cond:
            self._close_hooks.append(hook)

    # ------------------------------------------------------------------ close

    def begin_close(self) -> bool:
        """Step 1: refuse new work. False when another caller is already closing it."""
        with self._cond:
            if self.state != OPEN:
                return False
            self.state = CLOSING
            return True

    def finish_close(self, drain_seconds: float = DRAIN_SECONDS) -> None:
        """Steps 2-5 (see the module docstring). Call once, after :meth:`begin_close` returned True."""
        deadline = time.monotonic() + drain_seconds
        with self._cond:
            while self._leases and time.monotonic() < deadline:
                self._cond.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            if self._leases:
                # Keys are wiped anyway: an operation still running fails with KeyWiped (vault_locked).
                log.warning("vault %s: %d operation(s) still running at lock; their keys are wiped now", self.vault_id, self._leases)
            hooks = list(self._close_hooks)
        for hook in hooks:
            try:
                hook(self)
            except Exception:  # a hook must never keep a key alive
                log.exception("vault %s: a close hook failed", self.vault_id)
        with self._cond:
            items = list(self._attachments.items())[::-1]
            self._attachments.clear()
            self._detach_when_idle.clear()
        for _, item in items:
            _close_quietly(item, self.vault_id)
        self.store.close()  # wipes the vault key: last
        with self._cond:
            self.state = CLOSED
            self._cond.notify_all()

    def close(self, drain_seconds: float = DRAIN_SECONDS) -> bool:
        if not self.begin_close():
            return False
        self.finish_close(drain_seconds)
        return True


def _close_quietly(item: Closeable, vault_id: str) -> None:
    try:
        item.close()
    except Exception:
        log.exception("vault %s: closing a derived index failed", vault_id)


__all__ = ["LeaseScope", "LiveVault", "VaultLock", "OPEN", "CLOSING", "CLOSED", "locked_error"]
