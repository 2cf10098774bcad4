"""The router's answers to the vault-wide methods: every vault's process asked at once, or ended.

``vault list``, ``vault status``, ``daemon status``, ``memories status`` (``vault.overview``),
``grant list``, ``grant revoke GRANT_ID`` and ``rag.watch_reload`` need something of every unlocked
vault's process; the router asks them all at once (never note text: record counts, grant ids and
labels, folder-watch states) and answers for locked vaults itself. ``vault lock`` and ``vault delete``
end a vault's process. :class:`VaultWide` holds these handlers; the router
(:mod:`memoriesd.workers.router`) hands them to the daemon in place of the method table's.

Frozen workers: a question about a worker waits ``STATUS_SECONDS`` at most and is then answered
from what the worker said last, so a frozen process costs ``STATUS_SECONDS`` once, not per vault.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING, Any

from ..errors import MemoriesError, NotFound
from ..server.context import Context
from ..server.methods import vaults as vault_methods
from .model_client import ask as ask_socket

if TYPE_CHECKING:
    from ..server.app import App, Handler
    from .router import Router, Worker

#: How long the router waits for a worker's answer to a metadata question it must have (grants).
ASK_SECONDS = 10.0
#: How long ``vault list``, ``daemon status`` and the like wait for one worker's status (a frozen
#: worker then answers as it said last): never a second in all, since workers are asked at once.
STATUS_SECONDS = 0.5


class VaultWide:
    """The router's side of the methods that need every vault's process (asked at once) or end one."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._asking = concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="memoriesd-ask"
        )

    def handlers(self) -> dict[str, Handler]:
        """Method name -> the router's handler, in place of the one the method table declares."""
        return {
            "vault.list": self._vault_list,
            "vault.status": self._vault_status,
            "vault.lock": self._vault_lock,
            "vault.delete": self._vault_delete,
            "daemon.status": self._daemon_status,
            "grant.list": self._grant_list,
            "grant.revoke": self._grant_revoke,
            "rag.watch_reload": self._watch_reload,
            "vault.overview": self._overview,
        }

    def close(self) -> None:
        self._asking.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ asking workers

    def ask(self, w: Worker, name: str, params: dict[str, Any], timeout: float = ASK_SECONDS) -> object:
        """One request to a worker (metadata only: its reply never holds note text)."""
        return ask_socket(w.socket_path, name, params, timeout)

    def _status(self, w: Worker) -> dict[str, Any] | None:
        """The worker's ``vault.status``; None when it cannot answer (ending, or gone)."""
        try:
            out = self.ask(w, "vault.status", {"vault": w.vault_id}, STATUS_SECONDS)
        except TimeoutError:  # alive but frozen or too busy to answer: as it said last
            return {"vault_id": w.vault_id, "locked": not w.saw_unlocked}
        except (OSError, ConnectionError, MemoriesError):
            return None
        return out if isinstance(out, dict) else None

    def _statuses(self, vault_ids: list[str]) -> dict[str, dict[str, Any] | None]:
        """Every live worker of ``vault_ids`` asked at once: a frozen one costs ``STATUS_SECONDS``, once."""
        live = {v: w for v in vault_ids if (w := self.router.live(v)) is not None}
        futures = {v: self._asking.submit(self._status, w) for v, w in live.items()}
        return {v: (futures[v].result() if v in futures else None) for v in vault_ids}

    def _ask_all(
        self, ws: list[Worker], name: str, params: dict[str, Any] | None
    ) -> list[tuple[Worker, object]]:
        """Ask every worker at once (``params`` None: its own vault); each answer, or the exception it
        raised (a timeout for a frozen one)."""

        def one(w: Worker) -> object:
            try:
                return self.ask(
                    w, name, {"vault": w.vault_id} if params is None else params, STATUS_SECONDS * 2
                )
            except (OSError, ConnectionError, MemoriesError) as exc:
                return exc

        futures = [(w, self._asking.submit(one, w)) for w in ws]
        return [(w, f.result()) for w, f in futures]

    # ------------------------------------------------------------------ vaults

    def _vault_list(self, app: App, ctx: Context) -> dict[str, Any]:
        vaults = app.vaults.list_vaults()
        statuses = self._statuses([v["vault_id"] for v in vaults])
        for v in vaults:
            status = statuses[v["vault_id"]]
            v["locked"] = status is None or bool(status["locked"])
        return {"vaults": vaults}

    def _info(self, app: App, vault_id: str, status: dict[str, Any] | None) -> dict[str, Any]:
        if status is not None and "name" in status:
            return status
        info = vault_methods.vault_info(app, vault_id)
        if (
            status is not None
        ):  # a busy or frozen process: its vault is unlocked, its counts unknown right now
            info["locked"] = status["locked"]
        return info

    def _vault_status(self, app: App, ctx: Context) -> dict[str, Any]:
        ref = ctx.params.text("vault", None)
        ids = [v["vault_id"] for v in app.vaults.list_vaults()] if ref is None else [app.vaults.resolve(ref)]
        statuses = self._statuses(ids)
        infos = [self._info(app, v, statuses[v]) for v in ids]
        return {"vaults": infos} if ref is None else infos[0]

    def _vault_lock(self, app: App, ctx: Context) -> dict[str, Any]:
        router = self.router
        if ctx.params.flag("all", False):
            ws = router.workers()
            results: dict[str, bool] = {}
            threads = [
                threading.Thread(target=lambda w=w: results.__setitem__(w.vault_id, router.lock(w.vault_id)))
                for w in ws
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            locked = sorted(v for v, was in results.items() if was)
            others = [v["vault_id"] for v in app.vaults.list_vaults() if v["vault_id"] not in locked]
            return {"locked": locked, "already_locked": others}
        vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
        if router.lock(vault_id):
            return {"locked": [vault_id], "already_locked": []}
        return {"locked": [], "already_locked": [vault_id]}

    def _vault_delete(self, app: App, ctx: Context) -> dict[str, Any]:
        vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
        with self.router.gate(vault_id):  # no worker can start for it meanwhile
            w = self.router.live(vault_id)
            if w is not None:
                self.router.end(w, "delete")
            notices: list[str] = []
            name = app.vaults.name_of(vault_id)  # read before its header goes
            out: dict[str, Any] = {"deleted": app.vaults.delete(vault_id, notices), "name": name}
            if notices:
                out["notices"] = notices  # the remembered key could not be removed from the OS keyring
            return out

    def _daemon_status(self, app: App, ctx: Context) -> dict[str, Any]:
        out = vault_methods.daemon_status(app, ctx)
        ws = self.router.workers()
        statuses = self._statuses([w.vault_id for w in ws])
        out["unlocked"] = [
            w.vault_id for w in ws if (st := statuses[w.vault_id]) is not None and not st["locked"]
        ]
        out["vault_processes"] = [{"vault_id": w.vault_id, "pid": w.proc.pid} for w in ws]
        out["spare_process"] = self.router.spare_pid()
        out["model_process"] = self.router.model.pid
        return out

    def _overview(self, app: App, ctx: Context) -> dict[str, Any]:
        """``memories status``: every vault in one request. Each vault's process answers for its vault
        (asked at once, ``STATUS_SECONDS`` × 2 at most); a locked vault is answered here, and a process
        too busy to answer in time is shown unlocked with ``busy``."""
        ref = ctx.params.text("vault", None)
        ids = [app.vaults.resolve(ref)] if ref else [v["vault_id"] for v in app.vaults.list_vaults()]
        ws = [w for w in self.router.workers() if w.vault_id in ids]
        answers = {w.vault_id: res for w, res in self._ask_all(ws, "vault.overview", None)}
        rows: list[dict[str, Any]] = []
        for vault_id in ids:
            res = answers.get(vault_id)
            theirs = res.get("vaults") if isinstance(res, dict) else None
            if isinstance(theirs, list) and theirs and isinstance(theirs[0], dict):
                rows.append(theirs[0])
                continue
            row = vault_methods.vault_info(app, vault_id)
            if isinstance(res, TimeoutError):
                w = self.router.live(vault_id)
                row.update({"locked": not (w is not None and w.saw_unlocked), "busy": True})
            rows.append(row)
        return {"vaults": rows}

    # ------------------------------------------------------------------ grants and watches

    def _grant_list(self, app: App, ctx: Context) -> dict[str, Any]:
        if ctx.params.text("vault", None) is not None:
            return self._guarded("grant.list", app, ctx)
        grants: list[dict[str, Any]] = []
        answered: set[str] = set()
        for w, res in self._ask_all(self.router.workers(), "grant.list", None):
            if isinstance(res, dict):
                grants.extend(res["grants"])
                answered.add(w.vault_id)
        listed = app.vaults.list_vaults()
        locked = [v["vault_id"] for v in listed if v["vault_id"] not in answered]
        names = {v["vault_id"]: v["name"] for v in listed if v["vault_id"] in locked}
        grants.sort(key=lambda g: (g["vault_id"], -(g["created"] or 0), g["grant_id"]))
        return {"grants": grants, "locked_vaults": locked, "locked_vault_names": names}

    def _grant_revoke(self, app: App, ctx: Context) -> dict[str, Any]:
        p = ctx.params
        if p.flag("all", False) or p.text("vault", None) is not None:
            return self._guarded("grant.revoke", app, ctx)
        grant_id = p.text("grant_id", allow_empty=False, max_len=64)
        vaults = app.vaults.list_vaults()
        served = 0
        for _w, res in self._ask_all(self.router.workers(), "grant.revoke", {"grant_id": grant_id}):
            if isinstance(res, dict):
                return dict(res)
            if isinstance(res, MemoriesError) and res.code != "not_found":
                raise res
            served += isinstance(res, MemoriesError)
        locked = served < len(vaults)
        hint = (
            " (its vault may be locked: unlock it with `memories vault unlock VAULT_ID` and retry)"
            if locked
            else ""
        )
        raise NotFound(f"no grant {grant_id} in any unlocked vault{hint}: see `memories grant list`")

    def _declared(self, name: str) -> Handler:
        handler = self.router.app.methods.handler(name)
        assert handler is not None, f"{name} is declared in the method table"
        return handler

    def _guarded(self, name: str, app: App, ctx: Context) -> dict[str, Any]:
        self.router.refuse_if_served(ctx.params)
        return dict(self._declared(name)(app, ctx))

    def _watch_reload(self, app: App, ctx: Context) -> dict[str, Any]:
        out = dict(self._declared("rag.watch_reload")(app, ctx))
        rows = list(out.get("watches", []))
        for w, res in self._ask_all(self.router.workers(), "rag.watch_reload", {}):
            theirs = res.get("watches", []) if isinstance(res, dict) else []
            for i, row in enumerate(theirs[: len(rows)]):
                if isinstance(row, dict) and row.get("vault_id") == w.vault_id:
                    rows[i] = row
        out["watches"] = rows
        return out


__all__ = ["VaultWide", "ASK_SECONDS", "STATUS_SECONDS"]
