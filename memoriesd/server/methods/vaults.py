"""Daemon and vault methods of the protocol: ``daemon.*`` and ``vault.*``.

Each handler takes the :class:`~memoriesd.server.app.App` and a :class:`Context` and returns a
JSON-able dict. Handlers run in worker threads; the vault store serialises writes itself.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...errors import KeyringUnavailable, UsageError
from ...vault.rekey import RekeyParts
from ...vault.store import Setting, VaultStore, public_header
from ..context import Context
from ..method import Method

if TYPE_CHECKING:
    from ..app import App


def _passphrase(ctx: Context, name: str, required: bool = True) -> bytearray | None:
    value = ctx.params.text(name, None)
    if value is None:
        if required:
            raise UsageError(f"missing {name}")
        return None
    return bytearray(value.encode("utf-8"))


def _wipe(*bufs: bytearray | None) -> None:
    for b in bufs:
        if b is not None:
            for i in range(len(b)):
                b[i] = 0


def _remember(app: App, store: VaultStore, out: dict[str, Any]) -> None:
    """Keep the unlock secret in the OS keyring; "no keyring" is a normal state, said in a notice."""
    try:
        app.vaults.remember(store)
        out["remembered"] = True
    except KeyringUnavailable as exc:
        out["remembered"] = False
        out["notices"].append(exc.message)


def vault_info(app: App, vault_id: str) -> dict[str, Any]:
    store = app.vaults.unlocked_store(vault_id)
    header = public_header(app.home.vaults / vault_id)
    info: dict[str, Any] = {"vault_id": vault_id, "name": header["name"] if header else vault_id, "locked": store is None}
    if store is None and header is None:
        info["corrupt"] = True
    if store is not None:
        latest = store.latest()
        info["records"] = len(latest)
        info["device_only"] = bool(store.settings.get("policy.device_only", False))
        info["log_bytes"] = store.head.log_bytes
    return info


def vault_overview(app: App, ctx: Context) -> dict[str, Any]:
    """``memories status``: each vault's state, records, index and embedding progress, auto-lock time
    left and grant count; nothing of its text. The router asks every vault's process at once (each
    answers for its own vault) and answers for the locked ones itself."""
    ref = ctx.params.text("vault", None)
    ids = [app.vaults.resolve(ref)] if ref else [v["vault_id"] for v in app.vaults.list_vaults()]
    return {"vaults": [overview_of(app, vault_id) for vault_id in ids]}


def overview_of(app: App, vault_id: str) -> dict[str, Any]:
    """One vault's row of :func:`vault_overview` (read without a lease: it does not reset the auto-lock clock)."""
    info = vault_info(app, vault_id)
    live = app.vaults.live(vault_id)
    if live is None:
        return info
    store = live.store
    minutes = app.config.daemon.auto_lock_minutes
    left = minutes * 60.0 - (time.monotonic() - live.last_used)
    info["auto_lock_seconds"] = round(max(0.0, left), 1) if minutes > 0 else None
    from .grants import _grants_of

    info["grants"] = len(_grants_of(store))
    synced = app.sync.of(live)
    if synced is not None and synced.state.targets:
        info["sync"] = synced.summary()
    if app.rag is not None:
        from ...rag.status import embedding_progress

        idx = app.rag.peek_index(store)
        built = idx is not None and idx.bm25 is not None
        info["index"] = ("built" if idx.generation == store.generation else "stale") if built and idx else "none"
        info["fragments"] = idx.n_fragments() if built and idx else None
        emb = embedding_progress(app.rag, store)
        info["embedding"] = {k: emb.get(k) for k in ("available", "embedded", "total", "skipped", "state", "eta_seconds")}
    return info


# ---------------------------------------------------------------------------- daemon


def daemon_status(app: App, ctx: Context) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "version": __version__,
        "home": str(app.home.root),
        "uptime_seconds": round(time.monotonic() - app.started, 3),
        "unlocked": [v["vault_id"] for v in app.vaults.list_vaults() if not v["locked"]],
        "config": str(app.home.config_path),
        "restart_pending": app.config_watch.changed(),  # config.toml edited since the daemon started
        "config_error": app.config_watch.problem(),  # why the edited file is invalid (a restart would refuse it)
    }


def daemon_stop(app: App, ctx: Context) -> dict[str, Any]:
    app.request_stop()
    return {"stopping": True}


# ---------------------------------------------------------------------------- vaults


def vault_create(app: App, ctx: Context) -> dict[str, Any]:
    name = ctx.params.text("name", allow_empty=False, max_len=200)
    remember = ctx.params.flag("remember", False)
    device_only = ctx.params.flag("device_only", False)
    pw = _passphrase(ctx, "passphrase")
    assert pw is not None
    try:
        store = app.vaults.create(name, pw)
    finally:
        _wipe(pw)
    store = app.vaults.use(store.vault_id, ctx).store  # a lease: a lock from now on waits for this request
    out: dict[str, Any] = {"vault_id": store.vault_id, "name": store.name, "notices": []}
    if device_only:
        store.commit([Setting("policy.device_only", True)])
    out["device_only"] = device_only
    if remember:
        _remember(app, store, out)
    return out


def vault_list(app: App, ctx: Context) -> dict[str, Any]:
    return {"vaults": app.vaults.list_vaults()}


def vault_status(app: App, ctx: Context) -> dict[str, Any]:
    ref = ctx.params.text("vault", None)
    if ref is None:
        return {"vaults": [vault_info(app, v["vault_id"]) for v in app.vaults.list_vaults()]}
    return vault_info(app, app.vaults.resolve(ref))


def vault_unlock(app: App, ctx: Context) -> dict[str, Any]:
    ref = ctx.params.text("vault", allow_empty=False)
    remember = ctx.params.flag("remember", False)
    pw = _passphrase(ctx, "passphrase", required=False)
    try:
        store = app.vaults.unlock(ref, pw)
    finally:
        _wipe(pw)
    out: dict[str, Any] = {"vault_id": store.vault_id, "name": store.name, "locked": False, "notices": []}
    if remember:
        _remember(app, app.vaults.use(store.vault_id, ctx).store, out)
    return out


def vault_lock(app: App, ctx: Context) -> dict[str, Any]:
    """``locked``: the vaults this request locked; ``already_locked``: those that were locked before it."""
    if ctx.params.flag("all", False):
        locked = app.vaults.lock_all()
        others = [v["vault_id"] for v in app.vaults.list_vaults() if v["vault_id"] not in locked]
        return {"locked": locked, "already_locked": others}
    vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
    if app.vaults.lock(vault_id):
        return {"locked": [vault_id], "already_locked": []}
    return {"locked": [], "already_locked": [vault_id]}


def vault_passwd(app: App, ctx: Context) -> dict[str, Any]:
    """New passphrase; with ``rekey``, a new vault key too: the whole vault is sealed again under it
    (log, head, sealed vectors, recall counters; the lexical index is rebuilt), so a copy of the old
    header.json opens nothing written since."""
    ref = ctx.params.text("vault", allow_empty=False)
    rekey = ctx.params.flag("rekey", False)
    old = _passphrase(ctx, "old")
    new = _passphrase(ctx, "new")
    assert old is not None and new is not None
    out: dict[str, Any] = {}
    try:
        if rekey:
            out = dict(app.vaults.rekey(ref, old, new, rekey_parts()))
        else:
            app.vaults.passwd(ref, old, new)
            live = app.vaults.live(app.vaults.resolve(ref))
            vs = app.sync.of(live) if live is not None else None
            if vs is not None:
                vs.wake()  # the new header goes to the sync targets now
    finally:
        _wipe(old, new)
    return {"vault_id": app.vaults.resolve(ref), "changed": True, "rekeyed": rekey, **out}


def rekey_parts() -> RekeyParts:
    """What a key change does beside the log: grants keep working, sealed vectors and recall
    counters are sealed again under the new key (every other derived file is rebuilt)."""
    from ...index.vectors.maintenance import rekey_vectors
    from ...memory.recalls import rekey_recalls
    from ...sync.state import rekey_sync_state
    from ..grants import carry_grant

    return RekeyParts(setting=carry_grant, stage=(rekey_vectors, rekey_recalls, rekey_sync_state))


def vault_delete(app: App, ctx: Context) -> dict[str, Any]:
    notices: list[str] = []
    out: dict[str, Any] = {"deleted": app.vaults.delete(ctx.params.text("vault", allow_empty=False), notices)}
    if notices:
        out["notices"] = notices  # the remembered key could not be removed from the OS keyring
    return out


def vault_compact(app: App, ctx: Context) -> dict[str, Any]:
    store = app.lease(ctx).store
    t0 = time.perf_counter()
    stats: dict[str, Any] = dict(store.compact(app.config.vault.keep_revisions))
    if app.rag is not None:
        # Sealed vectors are derived from records: drop those of deleted records and old revisions too.
        from ...index.vectors.maintenance import compact_vectors

        stats.update(compact_vectors(store, app.rag.peek_index(store)))
    # So is the sealed lexical snapshot: rewritten from the purged index, or removed.
    from ...index.caches import compact_lexical

    stats.update(compact_lexical(store, app.rag.peek_index(store) if app.rag is not None else None))
    stats["seconds"] = round(time.perf_counter() - t0, 4)
    stats["vault_id"] = store.vault_id
    return stats


def vault_policy(app: App, ctx: Context) -> dict[str, Any]:
    store = app.lease(ctx).store
    device_only = ctx.params.flag("device_only", None)
    if device_only is not None:
        store.commit([Setting("policy.device_only", device_only)])
    extract = ctx.params.flag("extract", None)  # memory.extract: extraction after capture
    if extract is not None:
        store.commit([Setting("policy.extract", extract)])
    return {
        "vault_id": store.vault_id,
        "device_only": bool(store.settings.get("policy.device_only", False)),
        "extract": bool(store.settings.get("policy.extract", True)),
    }


#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("daemon.status", daemon_status, route="both"),
    Method("daemon.stop", daemon_stop, route="router"),
    Method("vault.create", vault_create, route="create"),
    Method("vault.list", vault_list, route="router"),
    Method("vault.status", vault_status, locked_ok=True, resend_safe=True),
    Method("vault.overview", vault_overview, route="both"),
    Method("vault.unlock", vault_unlock, route="start", resend_safe=True),
    Method("vault.lock", vault_lock, route="router"),
    Method("vault.passwd", vault_passwd, route="start"),
    Method("vault.delete", vault_delete, route="router"),
    Method("vault.compact", vault_compact),
    Method("vault.policy", vault_policy),
]
