"""The model process as the router sees it: started on the first ``model.route``, ended after a vault it served locks.

After a vault whose process used the model locks, no live process holds that vault's text: the
model process may have, so it is ended too (see :mod:`memoriesd.workers.model`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import subprocess
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Internal, MemoriesError, ModelUnavailable
from .process import EXIT_GRACE_SECONDS, child_command

if TYPE_CHECKING:
    from ..home import Home
    from ..server.app import App

log = logging.getLogger("memoriesd.workers")

#: How long the model process may take to load and self-check its model (EmbeddingGemma fp32: seconds).
MODEL_READY_SECONDS = 300.0


class ModelOwner(Protocol):
    """What the model process's host uses of the router that owns it (:class:`memoriesd.workers.router.Router`)."""

    @property
    def app(self) -> App: ...

    @property
    def home(self) -> Home: ...

    @property
    def keep_fds(self) -> tuple[int, ...]:
        """File descriptors a child keeps (the daemon's lock)."""

    @property
    def closed(self) -> bool:
        """The daemon is stopping: no process is started any more."""


class ModelHost:
    """The model process: one for every vault, started on demand, ended after a vault that used it locks."""

    def __init__(self, router: ModelOwner) -> None:
        self.router = router
        self._gate = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.socket_path: Path | None = None
        self.ended = threading.Event()
        self.served: set[str] = set()  # vaults whose processes were given the route since it started

    def _args(self) -> list[str]:
        app = self.router.app
        emb = app.config.embedding
        return ["--home", str(app.home.root), "--model-dir", str(app.rag.embedding.model_dir()),
                "--threads", str(emb.local.threads), "--max-tokens", str(emb.max_tokens),
                "--overrides", json.dumps(asdict(emb.overrides)), "--idle-seconds", str(emb.local.idle_minutes * 60)]

    def route(self, vault_id: str) -> dict[str, Any]:
        with self._gate:
            if self.router.closed:
                raise Internal("the daemon is stopping: run the command again once it has restarted")
            if self.proc is None or self.ended.is_set() or self.socket_path is None or not self.socket_path.exists():
                self._start()  # none yet, ended, or ending: an idle model process removes its socket first
            self.served.add(vault_id)
            return {"socket": str(self.socket_path)}

    def _start(self) -> None:
        path = self.router.home.run / f"m{secrets.token_hex(4)}.sock"
        with open(self.router.home.log_path, "ab") as errlog:
            proc = subprocess.Popen(child_command("memoriesd.workers.model", "--socket", str(path), *self._args()),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, close_fds=True,
                                    pass_fds=self.router.keep_fds)
        ended = threading.Event()
        said: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                said.append(line.decode("utf-8", "replace").strip())
                ready.set()
            proc.wait()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            ready.set()
            ended.set()

        threading.Thread(target=read, name="memoriesd-model", daemon=True).start()
        if not ready.wait(MODEL_READY_SECONDS) or not said or said[0] != "ready":
            with contextlib.suppress(OSError):
                proc.kill()
            first = said[0] if said else ""
            if first.startswith("failed "):
                parts = first.split(" ", 2)
                raise MemoriesError(parts[2] if len(parts) > 2 else "the model could not be loaded",
                                    code=parts[1] if len(parts) > 1 else "model_unavailable")
            raise ModelUnavailable("the embedding model's process did not start: see the daemon log (logs/memoriesd.log)")
        self.proc, self.socket_path, self.ended, self.served = proc, path, ended, set()
        log.info("the local embedding model is served by process %d", proc.pid)

    def recycle(self, vault_id: str | None = None) -> None:
        """End the model process if it served ``vault_id`` (any vault when None): it may hold its text."""
        with self._gate:
            if self.proc is None or self.ended.is_set():
                return
            if vault_id is not None and vault_id not in self.served:
                return
            proc, ended = self.proc, self.ended
            self.proc = None
            with contextlib.suppress(OSError):
                proc.kill()  # it keeps nothing on disk: no need to ask
            if not ended.wait(EXIT_GRACE_SECONDS):
                log.warning("the model process %d did not exit after SIGKILL", proc.pid)
            log.info("the model process %d ended%s", proc.pid, " (a vault it served locked)" if vault_id else "")

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and not self.ended.is_set() else None


__all__ = ["ModelHost", "ModelOwner", "MODEL_READY_SECONDS"]
