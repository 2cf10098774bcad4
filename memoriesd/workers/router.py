"""The router's side of ``[daemon] vault_process``: one worker process per unlocked vault.

The router never reads a frame that carries vault plaintext. It answers ``vault.route`` (where a
vault is served: a socket path, no content), starts a worker for ``vault.unlock``/``vault.passwd``
(``start``) and ``vault.create`` (``new``: a fresh vault id), and answers the vault-wide methods
itself, asking workers only for what holds no note text (record counts, grant ids and labels,
folder-watch states). Lock, auto-lock, delete and daemon stop end the worker process: ``lock
REASON`` on its stdin, then it locks (in-flight work drains as before) and exits. A worker whose
stdin closes (the router died, even by SIGKILL) locks and exits too.

Without ``vault_process``, ``vault.route`` answers ``{"socket": null}``: send everything here.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Internal, MemoriesError, NotFound, ProtocolError
from ..server import handlers, protocol
from ..server.context import Context, Params
from ..server.grants import _locked, _revoked
from ..server.handlers import HANDLERS, method
from ..vault.live import locked_error
from ..vault.records import new_record_id
from .routes import CREATE_METHOD, START_METHODS

log = logging.getLogger("memoriesd.workers")

#: How long a new worker may take to listen (a Python start and the daemon's imports: ~0.5 s here).
READY_SECONDS = 30.0
#: How long the router waits for a worker's answer to a metadata question.
ASK_SECONDS = 10.0
#: Beyond the vault's drain bound, how long a locking worker may take to exit before it is killed.
EXIT_GRACE_SECONDS = 15.0
_VAULT_ID = re.compile(r"^[a-z0-9]{6,32}$")


def route_first(what: str) -> ProtocolError:
    return ProtocolError(
        f"{what} is served by its own process ([daemon] vault_process = true) and this client sent the request to "
        "the main daemon socket: use the `memories` CLI and MCP server of this version (they ask vault.route first)"
    )


@method("vault.route")
def vault_route(app: Any, ctx: Context) -> dict[str, Any]:
    """Where to send a vault's requests: ``socket`` is a worker's, or null for this daemon itself."""
    if not isinstance(app.workers, Router):
        return {"socket": None}  # one process: everything is served here
    return app.workers.route(ctx.params)


@dataclass
class Worker:
    """One vault's process as the router sees it."""

    vault_id: str
    proc: subprocess.Popen[bytes]
    socket_path: Path
    ready: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    saw_unlocked: bool = False  # the worker said "unlocked" (read on its stdout)
    closing: bool = False  # the router asked it to lock and exit

    @property
    def alive(self) -> bool:
        return not self.ended.is_set() and not self.closing and self.proc.poll() is None


class Router:
    """The ``app.workers`` role of the main daemon when ``[daemon] vault_process = true``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.home = app.home
        self._lock = threading.Lock()
        self._workers: dict[str, Worker] = {}
        self._gates: dict[str, threading.Lock] = {}
        self._closed = False
        self._overrides = {
            "vault.list": self._vault_list,
            "vault.status": self._vault_status,
            "vault.lock": self._vault_lock,
            "vault.delete": self._vault_delete,
            "daemon.status": self._daemon_status,
            "grant.list": self._grant_list,
            "grant.revoke": self._grant_revoke,
            "rag.watch_reload": self._watch_reload,
            "vault.route": vault_route,
        }
        for stale in self.home.run.glob("w*.sock"):  # we hold the home's lock: left by an earlier crash
            with contextlib.suppress(OSError):
                stale.unlink()

    # ------------------------------------------------------------------ the daemon's hooks

    def handler(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        base = HANDLERS.get(name)
        if base is None:
            return None

        def guarded(app: Any, ctx: Context) -> dict[str, Any]:
            if name in START_METHODS or name == CREATE_METHOD:
                raise route_first("every vault")
            self._refuse_if_served(ctx.params)
            return base(app, ctx)  # the vault is locked here: the handler says so

        return guarded

    def loops(self, server: Any) -> list[Any]:
        return []

    def close(self) -> None:
        """Daemon stop: every worker locks its vault and exits."""
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
        threads = [threading.Thread(target=self._end, args=(w, "shutdown")) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ------------------------------------------------------------------ workers

    def live(self, vault_id: str) -> Worker | None:
        with self._lock:
            w = self._workers.get(vault_id)
        return w if w is not None and w.alive else None

    def workers(self) -> list[Worker]:
        with self._lock:
            return [w for w in self._workers.values() if w.alive]

    def _gate(self, vault_id: str) -> threading.Lock:
        with self._lock:
            return self._gates.setdefault(vault_id, threading.Lock())

    def _spawn(self, vault_id: str, create: bool = False) -> Worker:
        with self._gate(vault_id):
            with self._lock:
                current = self._workers.get(vault_id)
            if current is not None and current.alive:
                return current
            if current is not None:  # never two processes on one vault: the ending one exits first
                self._wait_end(current)
            with self._lock:
                if self._closed:
                    raise Internal("the daemon is stopping: run the command again once it has restarted")
            path = self.home.run / f"w{secrets.token_hex(4)}.sock"  # as long as memoriesd.sock (AF_UNIX limit)
            cmd = [sys.executable, "-m", "memoriesd.workers.worker", "--home", str(self.home.root), "--socket", str(path),
                   "--vault", vault_id] + (["--create"] if create else [])
            with open(self.home.log_path, "ab") as errlog:  # a worker that dies at import says why in the log
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, close_fds=True)
            w = Worker(vault_id, proc, path)
            threading.Thread(target=self._read, args=(w,), name=f"memoriesd-vault-{vault_id}", daemon=True).start()
            if not w.ready.wait(READY_SECONDS) or w.ended.is_set():
                with contextlib.suppress(OSError):
                    proc.kill()
                raise Internal(f"the process for vault {vault_id} did not start: see the daemon log (logs/memoriesd.log)")
            with self._lock:
                self._workers[vault_id] = w
            log.info("vault %s: served by process %d", vault_id, proc.pid)
            return w

    def _read(self, w: Worker) -> None:
        """The worker's stdout: ``ready``, ``unlocked``; its end is the process's end."""
        assert w.proc.stdout is not None
        for line in w.proc.stdout:
            word = line.strip()
            if word == b"ready":
                w.ready.set()
            elif word == b"unlocked":
                w.saw_unlocked = True
            elif word == b"closing":  # its vault is closed for good: route no more requests to it
                w.closing = True
        code = w.proc.wait()
        with contextlib.suppress(FileNotFoundError):
            w.socket_path.unlink()  # gone already unless the worker was killed
        with self._lock:
            if self._workers.get(w.vault_id) is w:
                del self._workers[w.vault_id]
        if not w.closing and code not in (0, None) and w.ready.is_set():
            log.warning("vault %s: its process %d ended unexpectedly (status %s): the vault is locked",
                        w.vault_id, w.proc.pid, code)
        w.ready.set()
        w.ended.set()

    def _end(self, w: Worker, reason: str) -> bool:
        """Make ``w`` lock its vault and exit; True when its vault had been unlocked."""
        w.closing = True
        try:
            assert w.proc.stdin is not None
            w.proc.stdin.write(f"lock {reason}\n".encode("ascii"))
            w.proc.stdin.close()
        except (OSError, ValueError):
            pass
        self._wait_end(w)
        return w.saw_unlocked

    def _wait_end(self, w: Worker) -> None:
        if not w.ended.wait(self.app.vaults.drain_seconds + EXIT_GRACE_SECONDS):
            log.warning("vault %s: its process %d did not exit after lock: killed", w.vault_id, w.proc.pid)
            with contextlib.suppress(OSError):
                w.proc.kill()
            w.ended.wait(EXIT_GRACE_SECONDS)

    def lock(self, vault_id: str, reason: str = "lock") -> bool:
        with self._gate(vault_id):
            w = self.live(vault_id)
            return self._end(w, reason) if w is not None else False

    def ask(self, w: Worker, name: str, params: dict[str, Any]) -> Any:
        """One request to a worker (metadata only: its reply never holds note text)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(ASK_SECONDS)
            s.connect(str(w.socket_path))
            s.sendall(protocol.encode({"id": 1, "method": name, "params": params}))
            while True:
                msg = protocol.recv_frame(s)
                if "progress" in msg:
                    continue
                if "error" in msg:
                    err = msg.get("error") or {}
                    raise MemoriesError(str(err.get("message", "")), code=str(err.get("code", "internal")))
                return msg.get("result")

    def _status(self, w: Worker) -> dict[str, Any] | None:
        """The worker's ``vault.status``; None when it cannot answer (ending, or gone)."""
        try:
            out = self.ask(w, "vault.status", {"vault": w.vault_id})
        except TimeoutError:  # alive but too busy to answer: as it said last
            return {"vault_id": w.vault_id, "locked": not w.saw_unlocked}
        except (OSError, ConnectionError, MemoriesError):
            return None
        return out if isinstance(out, dict) else None

    def _unlocked(self, vault_id: str) -> bool:
        w = self.live(vault_id)
        status = self._status(w) if w is not None else None
        return status is not None and not status["locked"]

    # ------------------------------------------------------------------ vault.route

    def route(self, p: Params) -> dict[str, Any]:
        if p.flag("new", False):
            fresh = self._spawn(new_record_id()[:12], create=True)
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
        name = self.app.vaults.name_of(vault_id)
        if w is not None:
            return {"vault_id": vault_id, "name": name, "socket": str(w.socket_path)}
        out: dict[str, Any] = {"vault_id": vault_id, "name": name, "socket": None, "locked": True}
        if not p.flag("locked_ok", False):  # the client raises it without sending its request (no plaintext here)
            out["error"] = (_locked(vault_id) if for_grant else locked_error(name)).to_dict()
        return out

    def _refuse_if_served(self, p: Params) -> None:
        ref = p.raw.get("vault")
        if isinstance(ref, str) and ref:
            vault_id = self.app.vaults.resolve(ref)
            if self.live(vault_id) is not None:
                raise route_first(f"vault {self.app.vaults.name_of(vault_id)}")

    # ------------------------------------------------------------------ the router's own methods

    def _vault_list(self, app: Any, ctx: Context) -> dict[str, Any]:
        vaults = app.vaults.list_vaults()
        for v in vaults:
            v["locked"] = not self._unlocked(v["vault_id"])
        return {"vaults": vaults}

    def _info(self, app: Any, vault_id: str) -> dict[str, Any]:
        w = self.live(vault_id)
        status = self._status(w) if w is not None else None
        if status is not None and "name" in status:
            return status
        info = handlers.vault_info(app, vault_id)
        if status is not None:  # a busy process: its vault is unlocked, its counts unknown right now
            info["locked"] = status["locked"]
        return info

    def _vault_status(self, app: Any, ctx: Context) -> dict[str, Any]:
        ref = ctx.params.text("vault", None)
        if ref is None:
            return {"vaults": [self._info(app, v["vault_id"]) for v in app.vaults.list_vaults()]}
        return self._info(app, app.vaults.resolve(ref))

    def _vault_lock(self, app: Any, ctx: Context) -> dict[str, Any]:
        if ctx.params.flag("all", False):
            ws = self.workers()
            results: dict[str, bool] = {}
            threads = [threading.Thread(target=lambda w=w: results.__setitem__(w.vault_id, self.lock(w.vault_id))) for w in ws]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            locked = sorted(v for v, was in results.items() if was)
            others = [v["vault_id"] for v in app.vaults.list_vaults() if v["vault_id"] not in locked]
            return {"locked": locked, "already_locked": others}
        vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
        if self.lock(vault_id):
            return {"locked": [vault_id], "already_locked": []}
        return {"locked": [], "already_locked": [vault_id]}

    def _vault_delete(self, app: Any, ctx: Context) -> dict[str, Any]:
        vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
        with self._gate(vault_id):  # no worker can start for it meanwhile
            w = self.live(vault_id)
            if w is not None:
                self._end(w, "delete")
            return {"deleted": app.vaults.delete(vault_id)}

    def _daemon_status(self, app: Any, ctx: Context) -> dict[str, Any]:
        out = handlers.daemon_status(app, ctx)
        ws = self.workers()
        out["unlocked"] = [w.vault_id for w in ws if self._unlocked(w.vault_id)]
        out["vault_processes"] = [{"vault_id": w.vault_id, "pid": w.proc.pid} for w in ws]
        return out

    def _grant_list(self, app: Any, ctx: Context) -> dict[str, Any]:
        if ctx.params.text("vault", None) is not None:
            return self._guarded("grant.list", app, ctx)
        grants: list[dict[str, Any]] = []
        locked: list[str] = []
        for v in app.vaults.list_vaults():
            w = self.live(v["vault_id"])
            try:
                res = self.ask(w, "grant.list", {"vault": v["vault_id"]}) if w is not None else None
            except (OSError, ConnectionError, MemoriesError):
                res = None
            if res is None:
                locked.append(v["vault_id"])
            else:
                grants.extend(res["grants"])
        grants.sort(key=lambda g: (g["vault_id"], -(g["created"] or 0), g["grant_id"]))
        return {"grants": grants, "locked_vaults": locked}

    def _grant_revoke(self, app: Any, ctx: Context) -> dict[str, Any]:
        p = ctx.params
        if p.flag("all", False) or p.text("vault", None) is not None:
            return self._guarded("grant.revoke", app, ctx)
        grant_id = p.text("grant_id", allow_empty=False, max_len=64)
        vaults = app.vaults.list_vaults()
        served = 0
        for v in vaults:
            w = self.live(v["vault_id"])
            if w is None:
                continue
            try:
                return dict(self.ask(w, "grant.revoke", {"grant_id": grant_id}))
            except MemoriesError as exc:
                if exc.code != "not_found":
                    raise
                served += 1
            except (OSError, ConnectionError):
                continue
        locked = served < len(vaults)
        hint = " (its vault may be locked: unlock it with `memories vault unlock VAULT_ID` and retry)" if locked else ""
        raise NotFound(f"no grant {grant_id} in any unlocked vault{hint}: see `memories grant list`")

    def _guarded(self, name: str, app: Any, ctx: Context) -> dict[str, Any]:
        self._refuse_if_served(ctx.params)
        return dict(HANDLERS[name](app, ctx))

    def _watch_reload(self, app: Any, ctx: Context) -> dict[str, Any]:
        out = dict(HANDLERS["rag.watch_reload"](app, ctx))
        rows = list(out.get("watches", []))
        for w in self.workers():
            try:
                theirs = self.ask(w, "rag.watch_reload", {}).get("watches", [])
            except (OSError, ConnectionError, MemoriesError):
                continue
            for i, row in enumerate(theirs[: len(rows)]):
                if isinstance(row, dict) and row.get("vault_id") == w.vault_id:
                    rows[i] = row
        out["watches"] = rows
        return out


__all__ = ["Router", "Worker", "vault_route", "route_first"]
