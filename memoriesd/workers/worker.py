"""A vault's worker process: ``memoriesd.main vault-process --home H --socket PATH (--vault ID [--create] | --spare)``.

Started isolated by the router (``python -I``, see :func:`memoriesd.workers.process.child_command`);
:func:`memoriesd.main.vault_process_main` assembles it from the parts here.
A *spare* starts bound to no vault and waits, imports done and the segmenter loaded, for ``bind ID
[create]`` on its stdin (an unlock); it refuses every request until then.

The same daemon code (``App``, ``Server``, every handler) bound to one vault on its own socket
(0600 in ``run/``, peer uid checked as the daemon does). It unlocks (or creates) the vault itself,
so the passphrase never reaches the router, and serves every request for it. It exits when:

- the vault locks (``vault lock``, auto-lock, or ``lock REASON`` from the router on stdin);
- its stdin closes: the router is gone (stopped, or killed), so nothing could route to it;
- nothing is unlocked and no request runs after an unlock or passwd attempt (a wrong passphrase
  leaves no process behind), or ``UNUSED_SECONDS`` after start if no client ever came.

Its stdout tells the router ``ready`` (listening), ``bound``, ``unlocked``, ``locking`` (a lock command
was read) and ``closing``; nothing else, never content. The local embedding model is not loaded here:
the model process serves it (:mod:`memoriesd.workers.model_client`).
Its exit returns all its memory to the kernel: that is the point (SECURITY.md "What is wiped").
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..errors import MemoriesError, ProtocolError, UsageError, VaultExists
from ..home import Home
from ..server.context import Context
from ..vault.format import Header
from ..vault.keys import VaultKeys
from ..vault.live import LeaseScope, LiveVault
from ..vault.manager import VaultManager, validate_name
from ..vault.rekey import RekeyParts
from ..vault.store import VaultStore
from .routes import ENDING

if TYPE_CHECKING:
    from ..server.app import App, Handler, Serving

log = logging.getLogger("memoriesd.workers")

#: A worker no client ever used (it went away between vault.route and its request) exits after this.
UNUSED_SECONDS = 30.0
#: How often the worker checks whether it still has a reason to live.
CHECK_SECONDS = 0.05
#: Ending by itself (nothing unlocked), it answers what is still arriving for up to this long...
CLOSING_GRACE_SECONDS = 2.0
#: ...and ends once no connection has been open for this long.
QUIET_SECONDS = 0.1
#: A request for the vault that arrives while another client's unlock runs here waits for it at most
#: this long (the Argon2id derivation, the slow-down after failures, the log's recovery and load).
UNLOCK_WAIT_SECONDS = 60.0
#: A process started for an unlock receives it within this (the client's next round trip): a request
#: that arrives first waits that long for the unlock to begin.
FIRST_REQUEST_SECONDS = 5.0


@contextlib.contextmanager
def kdf_turn(home: Home) -> Iterator[None]:
    """One Argon2id derivation at a time across the daemon's processes (``run/kdf.lock``), as the
    in-process KDF lock does within one: two at once never returned on some machines."""
    fd = os.open(home.run / "kdf.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def not_mine(vault_id: str) -> ProtocolError:
    return ProtocolError(
        f"this process serves vault {vault_id} only: ask the main daemon socket where another vault is served (vault.route)"
    )


class BoundVaults(VaultManager):
    """The worker's vault manager: one vault, the id the router chose; KDF work takes ``kdf_turn``."""

    def __init__(self, home: Home, config: Config, vault_id: str, create: bool, on_unlock: Callable[[], None]) -> None:
        super().__init__(home, config)
        self.vault_id = vault_id
        self._may_create = create
        self._on_register = on_unlock
        # An unlock in this process: requests for the vault wait for it (see await_unlock).
        self._opening = threading.Condition(threading.Lock())
        self._unlocking = 0
        self._attempted = False  # an unlock (or passwd) request has reached this process
        self._bound_at = time.monotonic()

    def bind(self, vault_id: str, create: bool) -> None:
        """A spare's manager takes the vault the router gave it."""
        self.vault_id, self._may_create = vault_id, create
        self._bound_at = time.monotonic()

    @contextlib.contextmanager
    def _opening_turn(self) -> Iterator[None]:
        """An unlock (or passwd) attempt: requests waiting in :meth:`await_unlock` wake when it ends."""
        with self._opening:
            self._attempted = True
            self._unlocking += 1
            self._opening.notify_all()
        try:
            yield
        finally:
            with self._opening:
                self._unlocking -= 1
                self._opening.notify_all()

    def await_unlock(self) -> None:
        """While this process's vault is being unlocked by another client's request (or the process was
        started for one that has not arrived yet), wait for it: a search sent during an unlock answers
        once the vault is open instead of "vault is locked". Bounded by ``UNLOCK_WAIT_SECONDS``."""
        deadline = time.monotonic() + UNLOCK_WAIT_SECONDS
        with self._opening:
            while self.live(self.vault_id) is None:
                now = time.monotonic()
                if self._unlocking:
                    until = deadline
                elif not self._attempted:
                    until = min(deadline, self._bound_at + FIRST_REQUEST_SECONDS)
                else:
                    return  # the unlock is over (it failed, or the vault locked since)
                if now >= until:
                    return
                self._opening.wait(until - now)

    def use(self, ref: str, ctx: LeaseScope) -> LiveVault:
        self.mine(ref)
        self.await_unlock()
        return super().use(ref, ctx)

    def mine(self, ref: str) -> str:
        vault_id = self.resolve(ref)
        if vault_id != self.vault_id:
            raise not_mine(self.vault_id)
        return vault_id

    def holds(self) -> bool:
        """The vault is open or still closing (its lock has not finished writing and wiping)."""
        with self._lock:
            return self.vault_id in self._unlocked

    def _register(self, store: VaultStore) -> LiveVault:
        entry = super()._register(store)
        self._on_register()
        return entry

    def create(self, name: str, passphrase: bytearray) -> VaultStore:
        """As :meth:`VaultManager.create`, under the id the router chose (it routes to this process by it)."""
        if not self._may_create:
            raise not_mine(self.vault_id)
        self._may_create = False
        name = validate_name(name)
        if not passphrase:
            raise UsageError("the passphrase is empty: choose a passphrase")
        with kdf_turn(self.home):  # also serialises the name check across processes
            if any(v["name"].casefold() == name.casefold() for v in self.list_vaults()):
                raise VaultExists(f"a vault named {name} already exists: choose another name")
            store = VaultStore.create(self.home.vaults / self.vault_id, self.vault_id, name, passphrase, self.kdf())
            self._register(store)
        log.info("vault %s created", self.vault_id)
        return store

    def join(self, shared: Header, passphrase: bytearray, name_of: Callable[[VaultKeys], str]) -> VaultStore:
        """As :meth:`VaultManager.join`, in the process the router started for the target's vault id."""
        if not self._may_create or shared.vault_id != self.vault_id:
            raise not_mine(self.vault_id)
        self._may_create = False
        joined = False
        try:
            with kdf_turn(self.home):
                store = super().join(shared, passphrase, name_of)
            joined = True
            return store
        finally:
            # A refused join (a wrong passphrase) made nothing: the CLI's next try, which the router
            # sends to this same process until it ends, may join again (a create's retry gets a new id).
            self._may_create = not joined

    def unlock(self, ref: str, passphrase: bytearray | None) -> VaultStore:
        self.mine(ref)
        with self._opening_turn(), kdf_turn(self.home):
            return super().unlock(ref, passphrase)

    def passwd(self, ref: str, old: bytearray, new: bytearray) -> None:
        self.mine(ref)
        with self._opening_turn(), kdf_turn(self.home):
            super().passwd(ref, old, new)

    def adopt_key(self, ref: str, shared: Header, passphrase: bytearray, parts: RekeyParts | None = None) -> dict[str, Any]:
        self.mine(ref)
        with kdf_turn(self.home):
            return super().adopt_key(ref, shared, passphrase, parts)

    def rekey(self, ref: str, old: bytearray, new: bytearray, parts: RekeyParts | None = None) -> dict[str, Any]:
        """As passwd: ``kdf_turn`` before the gate (the order unlock takes them), held for the rewrite too."""
        self.mine(ref)
        with kdf_turn(self.home):
            return super().rekey(ref, old, new, parts)


class WorkerRole:
    """The ``app.workers`` role of a vault's worker: which methods it serves, and when it exits."""

    def __init__(self, vault_id: str) -> None:
        self.vault_id = vault_id  # "" while a spare
        self.bound = threading.Event()
        if vault_id:
            self.bound.set()
        self.app: App | None = None  # set by the composition root
        self.started = time.monotonic()
        self.inflight = 0
        self.done = 0
        self.was_unlocked = False
        self.ending = False  # no new request: the vault is closed for good in this process
        self._count = threading.Lock()
        self._out = threading.Lock()

    def say(self, word: str) -> None:
        """One line to the router (``ready``, ``unlocked``): never content."""
        with self._out, contextlib.suppress(OSError, ValueError):
            sys.stdout.write(word + "\n")
            sys.stdout.flush()

    def unlocked(self) -> None:
        self.was_unlocked = True
        self.say("unlocked")

    def _app(self) -> App:
        assert self.app is not None, "the composition root sets the role's app"
        return self.app

    def handler(self, name: str) -> Handler | None:
        declared = self._app().methods.get(name)
        if declared is None:
            return None
        base = declared.handler

        def served(app: App, ctx: Context) -> dict[str, Any]:
            if not self.vault_id:
                raise ProtocolError("this process serves no vault yet: ask the main daemon socket (vault.route)")
            if declared.route == "router":  # "both": a vault's process answers it too
                raise ProtocolError(f"{name} is the main daemon's: send it to its socket, not to a vault's process")
            ref = ctx.params.raw.get("vault")
            if isinstance(ref, str) and ref:
                assert isinstance(app.vaults, BoundVaults)
                app.vaults.mine(ref)
            with self._count:
                if self.ending:
                    raise self.ending_error()
                self.inflight += 1
            try:
                return dict(base(app, ctx))
            finally:
                with self._count:
                    self.inflight -= 1
                    self.done += 1

        return served

    def loops(self, server: Serving) -> list[Coroutine[Any, Any, None]]:
        # jieba's dictionary loads while the process waits (a spare, or the first request's round trip);
        # in a thread of its own, so that a lock right after start never waits for it.
        threading.Thread(target=self._app().rag.warm, name="memoriesd-warm", daemon=True).start()
        return [self._life(server)]

    def close(self) -> None:
        return None

    def ending_error(self) -> MemoriesError:
        """A request that reached this process after it decided to end: nothing ran, the client asks again."""
        vaults = self._app().vaults
        name = vaults.name_of(self.vault_id) if self.vault_id else "(none)"
        return MemoriesError(
            f"the process of vault {name} is ending (the vault was locked): run the command again", code=ENDING
        )

    def bind(self, vault_id: str, create: bool) -> None:
        """A spare becomes the process of ``vault_id``."""
        vaults = self._app().vaults
        assert isinstance(vaults, BoundVaults)
        vaults.bind(vault_id, create)
        self.vault_id = vault_id
        # The folder list is applied live (``rag watch`` edits config.toml, then every vault process
        # reloads it); a spare was asked nothing, so it reads the list now, before its vault unlocks.
        try:
            self._app().watch.reload()
        except MemoriesError as exc:
            log.warning("vault %s: the watch folder list was not reloaded: %s", vault_id, exc.code)
        self.started = time.monotonic()
        for h in logging.getLogger().handlers:
            h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s [vault {vault_id}]: %(message)s"))
        self.bound.set()
        self.say("bound")

    def _control(self) -> None:
        """The router's commands on stdin: ``bind ID [create]``, ``lock REASON``; end of input = the router is gone."""
        reason = "the daemon stopped"
        try:
            for line in sys.stdin.buffer:
                parts = line.decode("ascii", "replace").split()
                if parts[:1] == ["bind"] and len(parts) >= 2 and not self.vault_id:
                    self.bind(parts[1], parts[2:3] == ["create"])
                elif parts[:1] == ["lock"]:
                    reason = " ".join(parts[1:]) or "lock"
                    break
        except (OSError, ValueError):
            pass
        live = self._app().vaults.live(self.vault_id) if self.vault_id else None
        if live is not None:
            live.stop_work()  # before new requests are refused: work in flight must not keep a late result
        self.say("locking")
        with self._count:
            self.ending = True  # requests in flight drain (the lock waits for them); new ones are refused
        try:
            self._app().vaults.lock_all(reason)
        finally:
            self._app().request_stop()

    async def _life(self, server: Serving) -> None:
        self.say("ready")
        threading.Thread(target=self._control, name="memoriesd-control", daemon=True).start()
        while not server.stopping.is_set():
            await asyncio.sleep(CHECK_SECONDS)
            if not self.bound.is_set():
                continue  # a spare waits for its vault however long it takes
            with self._count:
                vaults = self._app().vaults
                if self.ending or self.inflight or (isinstance(vaults, BoundVaults) and vaults.holds()):
                    continue
                if not (self.was_unlocked or self.done or time.monotonic() - self.started > UNUSED_SECONDS):
                    continue
                self.ending = True  # checked with the in-flight count: no request can open the vault again
            # The router starts another process for this vault only once this one has exited.
            self.say("closing")
            await self._drain_arrivals(server)
            server.stopping.set()  # locked (or never unlocked): the process ends, its memory with it

    async def _drain_arrivals(self, server: Serving) -> None:
        """Requests routed here before the router read ``closing`` (a retry right after a wrong
        passphrase) are answered ``vault_process_ending`` (nothing runs, the client asks the route
        again) instead of finding their connection reset: wait until no connection has been open for
        ``QUIET_SECONDS``, at most ``CLOSING_GRACE_SECONDS``."""
        deadline = time.monotonic() + CLOSING_GRACE_SECONDS
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            if server.active:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= QUIET_SECONDS:
                return
            await asyncio.sleep(CHECK_SECONDS / 5)
