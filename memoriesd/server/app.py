"""The application a handler is given: home, config, vaults, the retrieval engine, the method table, the role.

Built by the composition root (:mod:`memoriesd.main`) for the main daemon and for each vault's
process; tests build one in-process with :func:`memoriesd.main.build_app`. The process *role*
(the router, or a vault's worker) is a :class:`Role`, so that ``server`` never imports ``workers``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..config import Config
from ..errors import MemoriesError, UnknownMethod, VaultLocked
from ..home import Home
from ..rag.engine import RagEngine
from ..sync.service import SyncService
from ..vault.crypto import KeyWiped
from ..vault.live import LiveVault
from ..vault.manager import VaultManager
from ..watch import WatchService
from .config_watch import ConfigWatch
from .context import Context
from .grants import GrantUses, run_granted
from .method import MethodTable

#: A method's implementation in this application (see :mod:`.method`).
Handler = Callable[["App", Context], dict[str, Any]]


class Serving(Protocol):
    """What a role's loops watch of the server that runs them (:class:`memoriesd.server.daemon.Server`)."""

    @property
    def stopping(self) -> asyncio.Event: ...

    @property
    def active(self) -> int:
        """Accepted client connections not closed yet."""


class Role(Protocol):
    """What a process adds to the daemon code: the router (:class:`memoriesd.workers.router.Router`)
    or a vault's worker (:class:`memoriesd.workers.worker.WorkerRole`)."""

    def handler(self, name: str) -> Handler | None:
        """The handler this process runs for ``name`` (None: an unknown method)."""

    def loops(self, server: Serving) -> list[Coroutine[Any, Any, None]]:
        """Background coroutines the server runs while it serves."""

    def close(self) -> None:
        """Daemon stop: end what the role started (the router: every vault's process)."""

    def ending_error(self) -> MemoriesError:
        """The error for a request that arrived after the process decided to stop."""


class App:
    """Everything a handler may use: home, config, vaults, the retrieval engine and the method table."""

    def __init__(
        self,
        home: Home,
        config: Config,
        methods: MethodTable[App],
        config_watch: ConfigWatch | None = None,
        vaults: VaultManager | None = None,
    ) -> None:
        self.home = home
        self.config = config
        self.methods = methods
        #: The process role; None: in-process use (tests, scripts), every method served here.
        self.workers: Role | None = None
        # config.toml as read at start: an edit since is said in every reply ("restart pending").
        self.config_watch = config_watch or ConfigWatch(home.config_path)
        self.vaults: VaultManager = vaults or VaultManager(home, config)
        self.started = time.monotonic()
        self.stop_callback: Callable[[], None] | None = None
        #: Grants' `last use`, kept in memory and flushed to the vault now and then and on lock.
        self.grant_uses = GrantUses(self.vaults)
        self.rag = RagEngine(self)
        self.watch = WatchService(self)  # [[watch.folder]] folders, watched while their vault is unlocked
        self.sync = SyncService(self)  # sync targets, synced while their vault is unlocked

    def lease(self, ctx: Context) -> LiveVault:
        """The unlocked vault a request names in its ``vault`` parameter, leased for the request."""
        return self.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)

    def notices(self) -> list[str]:
        """Notices every reply carries (the frame's ``notices``): today, an edited config.toml."""
        return self.config_watch.notices()

    def request_stop(self) -> None:
        if self.stop_callback is not None:
            self.stop_callback()

    def dispatch(self, method: str, ctx: Context) -> dict[str, Any]:
        handler = self.methods.handler(method) if self.workers is None else self.workers.handler(method)
        if handler is None:
            raise UnknownMethod(f"unknown method {method!r}: the CLI and daemon versions may differ")
        try:
            if ctx.grant is None:
                return handler(self, ctx)
            return run_granted(self, ctx, method, handler, self.methods.get(method))
        except KeyWiped as exc:  # the vault was locked under the operation (past the drain bound)
            raise VaultLocked("the vault was locked during the operation: unlock it and run the command again") from exc
        finally:
            ctx.release()


__all__ = ["App", "Role", "Serving", "Handler"]
