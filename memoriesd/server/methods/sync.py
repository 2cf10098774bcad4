"""Protocol methods of encrypted sync: ``sync.*`` and ``vault.join`` (logic in :mod:`memoriesd.sync`).

All are owner-only: an MCP grant cannot add, remove or run a target; it sees synced records as any
others. ``vault.join`` carries a passphrase, so it is routed like ``vault.create``: to a fresh process
(the router reads the target's header first, to give that process the vault's id).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...errors import DeviceOnly, UsageError, VaultExists
from ...sync.segments import HEADER_FILE, Codec, Unreadable, read_target_header
from ...sync.service import VaultSync
from ...sync.transport import TargetError, parse_target
from ...vault.live import locked_error
from ...vault.manager import validate_name
from ..context import Context
from ..method import Method
from .vaults import _passphrase, _remember, _wipe

if TYPE_CHECKING:
    from ...vault.live import LiveVault
    from ..app import App


def _sync(app: App, vault: LiveVault) -> VaultSync:
    vs = app.sync.of(vault)
    if vs is None or not vs.state.targets:
        raise UsageError(f"vault {vault.name} does not sync: add a target with `memories sync add {vault.name} TARGET`")
    return vs


def sync_add(app: App, ctx: Context) -> dict[str, Any]:
    """Sync the vault with a folder or an rclone remote path (created when missing); the first
    cycle starts at once, in the background."""
    vault = app.lease(ctx)
    if vault.store.settings.get("policy.device_only", False):
        raise DeviceOnly(
            f"vault {vault.name} is device-only: it is never synced; turn that off with "
            f"`memories vault policy {vault.name} --device-only off` first"
        )
    text = ctx.params.text("target", allow_empty=False, max_len=4096)
    transport = parse_target(text, config=app.config)
    transport.ensure()
    data = transport.read(HEADER_FILE)
    if data is not None:
        try:
            th = read_target_header(data)
        except ValueError:
            raise TargetError(f"{transport.describe()} holds a damaged memories-sync.json: choose an empty folder or path") from None
        if th.header.vault_id != vault.vault_id:
            raise TargetError(f"{transport.describe()} holds another vault: choose an empty folder or path for this one")
    vs = app.sync.of(vault, create=True)
    assert vs is not None
    tid, ts = vs.add(text)
    return {"vault_id": vault.vault_id, "target_id": tid, "target": ts.target, "device": vs.state.device}


def sync_status(app: App, ctx: Context) -> dict[str, Any]:
    vault = app.lease(ctx)
    vs = app.sync.of(vault)
    if vs is None:
        return {"vault_id": vault.vault_id, "name": vault.name, "device": None, "targets": [], "conflicts": []}
    return {"vault_id": vault.vault_id, "name": vault.name, **vs.status()}


def sync_now(app: App, ctx: Context) -> dict[str, Any]:
    """One pull and push of every target (or ``target``), waited for; errors are per target."""
    vault = app.lease(ctx)
    vs = _sync(app, vault)
    results = vs.cycle(ctx.params.text("target", None))
    return {"vault_id": vault.vault_id, "name": vault.name, "results": results, **vs.status()}


def sync_remove(app: App, ctx: Context) -> dict[str, Any]:
    vault = app.lease(ctx)
    vs = _sync(app, vault)
    ts = vs.remove(ctx.params.text("target", allow_empty=False))
    return {"vault_id": vault.vault_id, "removed": ts.target}


def sync_compact(app: App, ctx: Context) -> dict[str, Any]:
    vault = app.lease(ctx)
    vs = _sync(app, vault)
    return {"vault_id": vault.vault_id, **vs.compact(ctx.params.text("target", None), ctx.params.flag("force", False))}


def sync_forget_device(app: App, ctx: Context) -> dict[str, Any]:
    vault = app.lease(ctx)
    vs = _sync(app, vault)
    return {"vault_id": vault.vault_id, **vs.forget_device(ctx.params.text("target", None), ctx.params.text("device", allow_empty=False, max_len=64))}


def sync_adopt_key(app: App, ctx: Context) -> dict[str, Any]:
    """Take the key another device changed to (``vault passwd --rekey`` there), with the new passphrase:
    this vault is sealed again under it and syncs on."""
    from .vaults import rekey_parts

    vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
    live = app.vaults.live(vault_id)
    if live is None:
        raise locked_error(app.vaults.name_of(vault_id))
    vs = _sync(app, live)
    shared = None
    for ts in list(vs.state.targets.values()):
        data = parse_target(ts.target, config=app.config).read(HEADER_FILE)
        if data is None:
            continue
        try:
            th = read_target_header(data)
        except ValueError:
            continue
        if th.header.vault_id == vault_id and not live.store.shares_key(th.header):
            shared = th.header
            break
    if shared is None:
        raise UsageError(f"no target of vault {live.name} holds another key: nothing to adopt (see `memories sync status`)")
    pw = _passphrase(ctx, "passphrase")
    assert pw is not None
    try:
        out = app.vaults.adopt_key(vault_id, shared, pw, rekey_parts())
    finally:
        _wipe(pw)
    return {"vault_id": vault_id, "adopted": True, **{k: v for k, v in out.items() if k != "vault_id"}}


def vault_join(app: App, ctx: Context) -> dict[str, Any]:
    """Make the vault on this device from a target and the passphrase, then pull everything."""
    text = ctx.params.text("target", allow_empty=False, max_len=4096)
    name = ctx.params.text("name", None, max_len=200)
    transport = parse_target(text, config=app.config)
    data = transport.read(HEADER_FILE)
    if data is None:
        raise TargetError(f"{transport.describe()} holds no vault (no {HEADER_FILE}): check the path, or wait until the sync tool has copied it")
    try:
        th = read_target_header(data)
    except ValueError:
        raise TargetError(f"{transport.describe()} holds a damaged {HEADER_FILE}: join from another copy of the target") from None
    if name is not None:
        name = validate_name(name)
    pw = _passphrase(ctx, "passphrase")
    assert pw is not None

    def local_name(keys: Any) -> str:
        codec = Codec(keys, th.header.vault_id)
        try:
            meta = json.loads(codec.open_name(th.sealed_name))
        except (Unreadable, ValueError):
            raise TargetError(f"{transport.describe()}: the vault's sealed name does not open: the target's header is damaged") from None
        finally:
            codec.wipe()
        chosen = name or validate_name(str(meta.get("name", "")))
        if any(v["name"].casefold() == chosen.casefold() for v in app.vaults.list_vaults()):
            raise VaultExists(f"a vault named {chosen} already exists here: join with --name NAME")
        return chosen

    try:
        store = app.vaults.join(th.header, pw, local_name)
    finally:
        _wipe(pw)
    vault = app.vaults.use(store.vault_id, ctx)
    vs = app.sync.of(vault, create=True)
    assert vs is not None
    tid, _ts = vs.add(text)
    results = vs.cycle(tid)
    out: dict[str, Any] = {"vault_id": store.vault_id, "name": store.name, "target_id": tid, "results": results, "notices": []}
    if ctx.params.flag("remember", False):
        _remember(app, vault.store, out)
    out["records"] = len(store.latest())
    return out


#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("sync.add", sync_add),
    Method("sync.status", sync_status),
    Method("sync.now", sync_now),
    Method("sync.remove", sync_remove),
    Method("sync.compact", sync_compact),
    Method("sync.forget_device", sync_forget_device),
    Method("sync.adopt_key", sync_adopt_key),
    Method("vault.join", vault_join, route="create"),
]

__all__ = ["sync_adopt_key", "sync_add", "sync_status", "sync_now", "sync_remove", "sync_compact", "sync_forget_device", "vault_join"]
