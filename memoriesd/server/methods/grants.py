"""Grant methods of the protocol: ``grant.create``, ``grant.list``, ``grant.revoke`` (the owner's side).

A grant's token, its verification and what a grant connection may do are in :mod:`memoriesd.server.grants`.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ...errors import NotFound, UsageError
from ...vault.records import new_record_id
from ...vault.store import Setting, VaultStore
from ..context import Context
from ..grants import (
    DEFAULT_SCOPES,
    DEFAULT_TTL_SECONDS,
    MAX_LABEL,
    MAX_TTL_SECONDS,
    SCOPES,
    SETTING_PREFIX,
    TOKEN_PREFIX,
    GrantUses,
    _token_hash,
)
from ..method import Method

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("memoriesd.grants")


def _grant_view(vault_id: str, rec: dict[str, Any], uses: GrantUses) -> dict[str, Any]:
    seen = uses.seen(vault_id, str(rec["id"]))
    last = max(float(rec.get("last_used") or 0.0), seen or 0.0) or None
    expires = rec.get("expires")
    return {
        "grant_id": rec["id"],
        "vault_id": vault_id,
        "label": rec.get("label", ""),
        "scopes": list(rec.get("scopes", [])),
        "cards_only": bool(rec.get("cards_only")),
        "created": rec.get("created"),
        "expires": expires,
        "expired": expires is not None and time.time() >= float(expires),
        "last_used": last,
    }


def _grants_of(store: VaultStore) -> list[dict[str, Any]]:
    return [dict(v) for v in store.setting_items(SETTING_PREFIX).values() if isinstance(v, dict)]


def grant_create(app: App, ctx: Context) -> dict[str, Any]:
    p = ctx.params
    store = app.lease(ctx).store
    scopes = p.texts("scopes", list(DEFAULT_SCOPES))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise UsageError(f"scopes must be a non-empty list of {', '.join(SCOPES)}")
    if "forget-all" in scopes:
        scopes.append("forget")  # forget-all widens forget: it never comes alone
    scopes = [s for s in SCOPES if s in scopes]
    if "ttl_seconds" in p.raw and p.raw["ttl_seconds"] is None:
        expires = None
    else:
        ttl = p.integer("ttl_seconds", DEFAULT_TTL_SECONDS, lo=1, hi=MAX_TTL_SECONDS)
        expires = round(time.time() + ttl, 3)
    grant_id = new_record_id()[:12]
    token = f"{TOKEN_PREFIX}{store.vault_id}_{grant_id}_{secrets.token_urlsafe(32)}"
    rec = {
        "id": grant_id,
        "hash": _token_hash(store, token),
        "scopes": scopes,
        "cards_only": p.flag("cards_only", False),
        "expires": expires,
        "label": p.text("label", "", max_len=MAX_LABEL),
        "created": round(time.time(), 3),
        "last_used": None,
    }
    store.commit([Setting(SETTING_PREFIX + grant_id, rec)])
    log.info("grant %s created for vault %s", grant_id, store.vault_id)
    return {
        "grant_id": grant_id,
        "token": token,
        "vault_id": store.vault_id,
        "vault_name": store.name,  # for the person's messages (names are readable while locked)
        "scopes": scopes,
        "cards_only": rec["cards_only"],
        "expires": expires,
        "label": rec["label"],
    }


def grant_list(app: App, ctx: Context) -> dict[str, Any]:
    ref = ctx.params.text("vault", None)
    uses = app.grant_uses
    ids = [app.vaults.resolve(ref)] if ref else [v["vault_id"] for v in app.vaults.list_vaults()]
    grants: list[dict[str, Any]] = []
    locked: list[str] = []
    for vid in ids:
        vault = app.vaults.use(vid, ctx) if ref else app.vaults.try_use(vid, ctx)
        if vault is None:
            locked.append(vid)
            continue
        grants.extend(_grant_view(vid, rec, uses) for rec in _grants_of(vault.store))
    grants.sort(key=lambda g: (g["vault_id"], -(g["created"] or 0), g["grant_id"]))
    return {"grants": grants, "locked_vaults": locked}


def grant_revoke(app: App, ctx: Context) -> dict[str, Any]:
    p = ctx.params
    if p.flag("all", False):
        store = app.lease(ctx).store
        with store.exclusive():  # read and delete together: a grant in use cannot be written back between
            ids = sorted(str(r["id"]) for r in _grants_of(store))
            store.commit([Setting(SETTING_PREFIX + g, None) for g in ids])
        log.info("revoked %d grants of vault %s", len(ids), store.vault_id)
        return {"revoked": ids, "vault_id": store.vault_id}
    grant_id = p.text("grant_id", allow_empty=False, max_len=64)
    locked = False
    for v in app.vaults.list_vaults():
        held = app.vaults.try_use(v["vault_id"], ctx)
        if held is None:
            locked = True
            continue
        store = held.store
        with store.exclusive():
            found = SETTING_PREFIX + grant_id in store.settings
            if found:
                store.commit([Setting(SETTING_PREFIX + grant_id, None)])
        if found:
            log.info("grant %s of vault %s revoked", grant_id, store.vault_id)
            return {"revoked": [grant_id], "vault_id": store.vault_id}
    hint = " (its vault may be locked: unlock it with `memories vault unlock VAULT_ID` and retry)" if locked else ""
    raise NotFound(f"no grant {grant_id} in any unlocked vault{hint}: see `memories grant list`")


#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("grant.create", grant_create),
    Method("grant.list", grant_list),
    Method("grant.revoke", grant_revoke),
]
