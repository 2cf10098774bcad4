"""The main daemon's side of the process shape: one worker process per unlocked vault, one model process.

The router (the process that owns the daemon's socket) never holds a vault key, a passphrase, a
note, a query or a result: it never reads a frame that carries vault plaintext. It answers ``vault.route`` (where a
vault is served: a socket path, no content), starts a worker for ``vault.unlock``/``vault.passwd``
(``start``) and ``vault.create`` (``new``: a fresh vault id), and answers the vault-wide methods
itself (:mod:`memoriesd.workers.fanout`), asking workers only for what holds no note text (record
counts, grant ids and labels, folder-watch states). Lock, auto-lock, delete and daemon stop end the worker process: ``lock
REASON`` on its stdin, then it locks (in-flight work drains as before) and exits. A worker whose
stdin closes (the router died, even by SIGKILL) locks and exits too.

Latency: one *spare* worker waits, imports done and the segmenter's dictionary loaded, bound to no
vault; an unlock hands it the vault (``bind ID`` on its stdin) and a new spare starts behind it.

Frozen workers: questions about a worker (status, lists) wait ``fanout.STATUS_SECONDS`` at most and
then answer from what the worker said last; a lock that the worker does not acknowledge within
``ACK_SECONDS`` ends it (SIGTERM, then SIGKILL): acknowledged writes are on disk already.

The model process (:class:`ModelHost`): started on the first ``model.route`` from a worker, ended
when a vault whose worker used it locks (after it, no live process holds that vault's text).
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import subprocess
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import Busy, Internal, MemoriesError, ProtocolError, VaultExists
from ..server.context import Context, Params
from ..server.grants import _locked, _revoked
from ..server.method import Method
from ..vault.live import locked_error
from ..vault.records import new_record_id
from .fanout import VaultWide
from .model_host import ModelHost
from .process import EXIT_GRACE_SECONDS, child_command

if TYPE_CHECKING:
    from ..server.app import App, Handler, Serving

log = logging.getLogger("memoriesd.workers")

#: How long a new worker may take to listen (a Python start and the daemon's imports: ~0.5 s here).
READY_SECONDS = 30.0
#: A worker told to lock says ``locking`` within this, or it is frozen and is ended by signal.
ACK_SECONDS = 2.0
#: After SIGTERM, how long before SIGKILL.
TERM_SECONDS = 1.5
_VAULT_ID = re.compile(r"^[a-z0-9]{6,32}$")


def route_first(what: str) -> ProtocolError:
    return ProtocolError(
        f"{what} is served by its own process and this client sent the request to the main daemon socket: "
        "use the `memories` CLI and MCP server of this version (they ask vault.route first)"
    )


def vault_route(app: App, ctx: Context) -> dict[str, Any]:
    """Where to send a vault's requests: the socket of the process that serves it."""
    if not isinstance(app.workers, Router):
        raise ProtocolError("vault.route is the main daemon's: send it to its socket")
    return app.workers.route(ctx.params)


def model_route(app: App, ctx: Context) -> dict[str, Any]:
    """Where a vault's process reaches the local embedding model (started on first use)."""
    if not isinstance(app.workers, Router):
        raise ProtocolError("model.route is the main daemon's: send it to its socket")
    return app.workers.model.route(ctx.params.text("vault", allow_empty=False, max_len=64))


#: The router's own methods (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("vault.route", vault_route, route="router"),
    Method("model.route", model_route, route="router"),
]


def _stop(proc: subprocess.Popen[bytes], ended: threading.Event, what: str) -> None:
    """SIGTERM, then SIGKILL: a process that does not answer (frozen, stopped, hung) is ended anyway."""
    log.warning("%s: ended by signal", what)
    with contextlib.suppress(OSError):
        proc.terminate()
    if not ended.wait(TERM_SECONDS):
        with contextlib.suppress(OSError):
            proc.kill()  # works on a stopped process too
        ended.wait(EXIT_GRACE_SECONDS)


@dataclass
class Worker:
    """One vault's process as the router sees it (``vault_id`` is "" while it is the spare)."""

    vault_id: str
    proc: subprocess.Popen[bytes]
    socket_path: Path
    ready: threading.Event = field(default_factory=threading.Event)
    bound: threading.Event = field(default_factory=threading.Event)  # said "bound" (a spare given its vault)
    acked: threading.Event = field(default_factory=threading.Event)  # said "locking" after a lock command
    ended: threading.Event = field(default_factory=threading.Event)
    saw_unlocked: bool = False  # the worker said "unlocked" (read on its stdout)
    closing: bool = False  # the router asked it to lock and exit

    @property
    def alive(self) -> bool:
        return not self.ended.is_set() and not self.closing and self.proc.poll() is None

    def tell(self, line: str) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode("ascii") + b"\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False


class Router:
    """The ``app.workers`` role of the main daemon: every vault is served by a process of its own."""

    def __init__(self, app: App, keep_fds: tuple[int, ...] = ()) -> None:
        self.app = app
        self.home = app.home
        # The home's daemon lock, inherited by every child: a daemon started after a crash of this
        # one waits until the orphaned vault processes have locked and exited (never two on a vault).
        self.keep_fds = keep_fds
        self._lock = threading.Lock()
        self._workers: dict[str, Worker] = {}
        self._gates: dict[str, threading.Lock] = {}
        self._starting: dict[str, threading.Event] = {}  # a process being started for the vault (set: done)
        self._spare: Worker | None = None
        self._spare_gate = threading.Lock()
        self.closed = False
        self.model = ModelHost(self)
        # The router's side of methods that need every vault's process (asked at once) or must
        # end one; every other method runs as declared in the table, refused when a vault's
        # process serves the vault it names.
        self.vault_wide = VaultWide(self)
        self._overrides: dict[str, Handler] = self.vault_wide.handlers()
        for stale in [*self.home.run.glob("w*.sock"), *self.home.run.glob("m*.sock")]:  # we hold the home's lock
            with contextlib.suppress(OSError):
                stale.unlink()

    # ------------------------------------------------------------------ the daemon's hooks

    def handler(self, name: str) -> Handler | None:
        if name in self._overrides:
            return self._overrides[name]
        declared = self.app.methods.get(name)
        if declared is None:
            return None
        if any(declared is own for own in METHODS):  # vault.route, model.route: about vaults, never refused
            return declared.handler
        base = declared.handler

        def guarded(app: App, ctx: Context) -> dict[str, Any]:
            if declared.route in ("start", "create"):
                raise route_first("every vault")
            self.refuse_if_served(ctx.params)
            return base(app, ctx)  # the vault is locked here: the handler says so

        return guarded

    def ending_error(self) -> MemoriesError:
        return Busy("memoriesd is stopping: run the command again in a moment")

    def loops(self, server: Serving) -> list[Coroutine[Any, Any, None]]:
        threading.Thread(target=self._ensure_spare, name="memoriesd-spare", daemon=True).start()
        return []

    def close(self) -> None:
        """Daemon stop: every worker locks its vault and exits; the spare and the model process end."""
        with self._lock:
            self.closed = True
            workers = list(self._workers.values())
        with self._spare_gate:
            spare, self._spare = self._spare, None
        if spare is not None:
            workers.append(spare)
        threads = [threading.Thread(target=self.end, args=(w, "shutdown")) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.model.recycle()
        self.vault_wide.close()

    # ------------------------------------------------------------------ workers

    def live(self, vault_id: str) -> Worker | None:
        with self._lock:
            w = self._workers.get(vault_id)
        return w if w is not None and w.alive else None

    def workers(self) -> list[Worker]:
        with self._lock:
            return [w for w in self._workers.values() if w.alive]

    def gate(self, vault_id: str) -> threading.Lock:
        with self._lock:
            return self._gates.setdefault(vault_id, threading.Lock())

    def _start(self, vault_id: str, create: bool = False) -> Worker:
        """A new worker process for ``vault_id`` ("" = a spare, bound later); waits until it listens."""
        path = self.home.run / f"w{secrets.token_hex(4)}.sock"  # as long as memoriesd.sock (AF_UNIX limit)
        args = ["--home", str(self.home.root), "--socket", str(path)]
        args += ["--vault", vault_id] + (["--create"] if create else []) if vault_id else ["--spare"]
        with open(self.home.log_path, "ab") as errlog:  # a worker that dies at import says why in the log
            proc = subprocess.Popen(child_command("memoriesd.main", "vault-process", *args), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errlog, close_fds=True, pass_fds=self.keep_fds)
        w = Worker(vault_id, proc, path)
        threading.Thread(target=self._read, args=(w,), name="memoriesd-vault", daemon=True).start()
        if not w.ready.wait(READY_SECONDS) or w.ended.is_set():
            with contextlib.suppress(OSError):
                proc.kill()
            what = f"vault {self.app.vaults.name_of(vault_id)}" if vault_id else "a spare vault process"
            raise Internal(f"the process for {what} did not start: see the daemon log (logs/memoriesd.log)")
        return w

    def _ensure_spare(self) -> None:
        """Start the spare worker unless one waits (run in a thread: it takes a Python start)."""
        with self._spare_gate:
            if self.closed or (self._spare is not None and self._spare.alive):
                return
            try:
                self._spare = self._start("")
            except MemoriesError:
                log.warning("the spare vault process did not start: unlocks start their own")
                self._spare = None

    def _replenish(self) -> None:
        """A new spare, once the last one's unlock has derived its key (or failed): starting a Python
        process beside the Argon2id derivation would slow the unlock it was there to speed up."""
        if not self.closed:
            threading.Thread(target=self._ensure_spare, name="memoriesd-spare", daemon=True).start()

    def _take_spare(self, vault_id: str, create: bool) -> Worker | None:
        with self._spare_gate:
            spare, self._spare = self._spare, None
        if spare is None or not spare.alive:
            return None
        spare.vault_id = vault_id
        if not spare.tell(f"bind {vault_id}{' create' if create else ''}") or not spare.bound.wait(READY_SECONDS):
            self.end(spare, "unused")
            return None
        return spare

    def _spawn(self, vault_id: str, create: bool = False) -> Worker:
        started = threading.Event()
        with self._lock:
            self._starting[vault_id] = started
        try:
            with self.gate(vault_id):
                with self._lock:
                    current = self._workers.get(vault_id)
                if current is not None and current.alive:
                    return current
                if current is not None:  # never two processes on one vault: the ending one exits first
                    self._wait_end(current)
                if self.closed:
                    raise Internal("the daemon is stopping: run the command again once it has restarted")
                w = self._take_spare(vault_id, create) or self._start(vault_id, create)
                with self._lock:
                    self._workers[vault_id] = w
                log.info("vault %s: served by process %d", vault_id, w.proc.pid)
                return w
        finally:
            with self._lock:
                if self._starting.get(vault_id) is started:
                    del self._starting[vault_id]
            started.set()

    def _live_after_start(self, vault_id: str) -> Worker | None:
        """The vault's process, once one that another client's unlock is starting listens (a request
        sent during that unlock goes to it and waits there for the unlock: see ``BoundVaults.await_unlock``)."""
        with self._lock:
            starting = self._starting.get(vault_id)
        if starting is not None:
            starting.wait(READY_SECONDS)
        return self.live(vault_id)

    def _read(self, w: Worker) -> None:
        """The worker's stdout: ``ready``, ``bound``, ``unlocked``, ``locking``, ``closing``; its end is the process's end."""
        assert w.proc.stdout is not None
        for line in w.proc.stdout:
            word = line.strip()
            if word == b"ready":
                w.ready.set()
            elif word == b"bound":
                w.bound.set()
            elif word == b"unlocked":
                w.saw_unlocked = True
                self._replenish()
            elif word == b"locking":
                w.acked.set()
            elif word == b"closing":  # its vault is closed for good: route no more requests to it
                w.closing = True
        code = w.proc.wait()
        with contextlib.suppress(FileNotFoundError):
            w.socket_path.unlink()  # gone already unless the worker was killed
        with self._lock:
            if w.vault_id and self._workers.get(w.vault_id) is w:
                del self._workers[w.vault_id]
        if w.vault_id:  # the model process may hold this vault's text: it goes with the vault
            self.model.recycle(w.vault_id)
            self._replenish()
        if not w.closing and code not in (0, None) and w.ready.is_set():
            log.warning("vault %s: its process %d ended unexpectedly (status %s): the vault is locked",
                        w.vault_id or "(spare)", w.proc.pid, code)
        w.ready.set()
        w.bound.set()
        w.acked.set()
        w.ended.set()

    def end(self, w: Worker, reason: str) -> bool:
        """Make ``w`` lock its vault and exit; True when its vault had been unlocked."""
        w.closing = True
        told = w.tell(f"lock {reason}")
        with contextlib.suppress(OSError, ValueError):
            assert w.proc.stdin is not None
            w.proc.stdin.close()
        if not told or not w.acked.wait(ACK_SECONDS):  # frozen (stopped, hung): it cannot lock itself
            if not w.ended.is_set():
                _stop(w.proc, w.ended, f"vault {w.vault_id or '(spare)'}: its process {w.proc.pid} did not answer the lock")
        self._wait_end(w)
        return w.saw_unlocked

    def _wait_end(self, w: Worker) -> None:
        if not w.ended.wait(self.app.vaults.drain_seconds + EXIT_GRACE_SECONDS):
            log.warning("vault %s: its process %d did not exit after lock: killed", w.vault_id, w.proc.pid)
            with contextlib.suppress(OSError):
                w.proc.kill()
            w.ended.wait(EXIT_GRACE_SECONDS)

    def lock(self, vault_id: str, reason: str = "lock") -> bool:
        with self.gate(vault_id):
            w = self.live(vault_id)
            return self.end(w, reason) if w is not None else False

    # ------------------------------------------------------------------ vault.route

    def route(self, p: Params) -> dict[str, Any]:
        if p.flag("new", False):
            joining = p.text("join", None, max_len=4096)
            vault_id = new_record_id()[:12] if joining is None else self._joining(joining)
            fresh = self._spawn(vault_id, create=True)
            return {"vault_id": fresh.vault_id, "socket": str(fresh.socket_path)}
        ref = p.text("vault", allow_empty=False, max_len=200)
        for_grant = p.flag("for_grant", False)
        if for_grant:  # the vault id of a grant token: an unknown one answers as session.grant would
            if not _VAULT_ID.match(ref) or not (self.home.vaults / ref).is_dir():
                return {"socket": None, "error": _revoked().to_dict()}
            vault_id = ref
        else:
            vault_id = self.app.vaults.resolve(ref)
        w = self.live(vault_id)
        if w is None and p.flag("start", False):
            w = self._spawn(vault_id)
        elif w is None and not p.flag("locked_ok", False):
            w = self._live_after_start(vault_id)
        name = self.app.vaults.name_of(vault_id)
        if w is not None:
            return {"vault_id": vault_id, "name": name, "socket": str(w.socket_path)}
        out: dict[str, Any] = {"vault_id": vault_id, "name": name, "socket": None, "locked": True}
        if not p.flag("locked_ok", False):  # the client raises it without sending its request (no plaintext here)
            out["error"] = (_locked(vault_id) if for_grant else locked_error(name)).to_dict()
        return out

    def _joining(self, target: str) -> str:
        """The id of the vault a sync target holds (read from its header: no secret), new here."""
        from ..sync.segments import HEADER_FILE, read_target_header
        from ..sync.transport import TargetError, parse_target

        transport = parse_target(target, config=self.app.config)
        data = transport.read(HEADER_FILE)
        if data is None:
            raise TargetError(f"{transport.describe()} holds no vault (no {HEADER_FILE}): check the path, or wait until the sync tool has copied it")
        try:
            vault_id = read_target_header(data).header.vault_id
        except ValueError:
            raise TargetError(f"{transport.describe()} holds a damaged {HEADER_FILE}: join from another copy of the target") from None
        if (self.home.vaults / vault_id).exists():
            raise VaultExists(
                f"this device already has the vault that {transport.describe()} holds ({self.app.vaults.name_of(vault_id)}): "
                f"unlock it, and add the target with `memories sync add`"
            )
        return vault_id

    def refuse_if_served(self, p: Params) -> None:
        ref = p.raw.get("vault")
        if isinstance(ref, str) and ref:
            vault_id = self.app.vaults.resolve(ref)
            if self.live(vault_id) is not None:
                raise route_first(f"vault {self.app.vaults.name_of(vault_id)}")

    def spare_pid(self) -> int | None:
        """The spare worker's process id (``daemon status``), None while none waits."""
        spare = self._spare
        return spare.proc.pid if spare is not None and spare.alive else None


__all__ = ["Router", "Worker", "vault_route", "model_route", "route_first"]
