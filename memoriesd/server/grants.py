"""Scoped, revocable grants for AI clients (the MCP server) and their enforcement.

A grant is for exactly one vault. Its token ``mg_<vault_id>_<grant_id>_<secret>`` carries the ids
in clear so the daemon can find the grant while the vault is locked; the secret is 256 random bits.
The daemon keeps only ``HMAC(subkey(vault key, LABEL_GRANTS), token)``, sealed in the vault's log
as the Setting ``grant.<grant_id>`` with the scopes and expiry. So a grant survives lock/unlock and
restart, a copied vault directory reveals no token, and a locked vault cannot verify (nor serve)
any grant: every call answers ``vault_locked``.

The hooks :func:`authorize` and :func:`filter_result` run around every handler on a connection
that presented a grant (see ``App.dispatch``). Work in flight re-verifies the grant through
``ctx.checks``, so expiry, revocation and lock cancel it and a late result is dropped.

Write scopes (``remember``, ``capture``, ``forget``, ``forget-all``) are never defaults. A granted
write runs ``ctx.check_cancelled()`` under the vault's store lock right before its commit
(``facts.remember``, the conversation capture, ``forget.purge``), and ``grant.revoke`` deletes the grant under that same lock: a write either
committed before the revocation, or it is cancelled and nothing of it is written. A granted write
sees only what the grant could see: ``memory.remember`` never matches (so never revises or
reveals) a private fact, and ``memory.forget`` can name only records a grant may see (private
records, credentials and files answer like a missing id; ``all`` needs ``forget-all``).
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import GrantInvalid, Internal, MemoriesError, NotFound, ScopeDenied, UsageError, VaultLocked
from ..vault import crypto
from ..vault.records import UNSEARCHABLE_KINDS, Record, new_record_id
from ..vault.rekey import Rekeying
from ..vault.store import Setting, VaultStore
from .context import Context, Params, PresentedGrant

if TYPE_CHECKING:
    from ..home import Home
    from ..vault.manager import VaultManager
    from .method import Method

log = logging.getLogger("memoriesd.grants")

TOKEN_PREFIX = "mg_"
SETTING_PREFIX = "grant."
SCOPES = ("search", "read", "retrieve", "ask", "context", "remember", "capture", "forget", "forget-all")
DEFAULT_SCOPES = ("search", "read", "retrieve")
#: Scopes that change the vault: never granted unless asked for by name.
WRITE_SCOPES = ("remember", "capture", "forget", "forget-all")
#: Scopes that show stored text; a write's reply quotes stored text only to a grant holding one.
TEXT_SCOPES = ("search", "read", "retrieve", "context")
DEFAULT_TTL_SECONDS = 24 * 3600
MAX_TTL_SECONDS = 10 * 366 * 24 * 3600
MAX_LABEL = 200
# `last use` is kept in memory on every call and written to the vault at most this often (and on
# lock): a write bumps the vault generation, which would cancel an owner's long indexing run.
PERSIST_LAST_USE_SECONDS = 600.0

_ID = re.compile(r"^[a-z0-9]{6,32}$")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{43,128}$")


class GrantHolder(Protocol):
    """A connection as ``session.grant`` sees it (:class:`memoriesd.server.daemon.Connection`)."""

    grant: PresentedGrant | None


@dataclass(frozen=True)
class ParsedToken:
    vault_id: str
    grant_id: str


def parse_token(token: str) -> ParsedToken:
    """The ids a token names; ``grant_invalid`` when it is not shaped like one of ours."""
    parts = token.split("_", 3)
    if (
        len(parts) != 4
        or parts[0] + "_" != TOKEN_PREFIX
        or not _ID.match(parts[1])
        or not _ID.match(parts[2])
        or not _SECRET.match(parts[3])
    ):
        raise GrantInvalid(
            "the grant token is malformed: copy it again, or ask the person to run `memories grant create VAULT_ID`"
        )
    return ParsedToken(parts[1], parts[2])


def _token_hash(store: VaultStore, token: str, rec: dict[str, Any] | None = None) -> str:
    """HMAC of the token under the vault's grant subkey, or under the key a grant made before a key
    change carries (``hash_key``: its hash cannot be made again without the token)."""
    carried = rec.get("hash_key") if rec is not None else None
    if isinstance(carried, str):
        try:
            key = bytearray(base64.b64decode(carried, validate=True))
        except ValueError:
            key = bytearray()
        if len(key) != crypto.KEY_BYTES:
            return ""  # never verifies
        if store.closed:
            raise crypto.KeyWiped("the vault was locked")
    else:
        key = store.keys.subkey(crypto.LABEL_GRANTS)
    try:
        return crypto.mac(key, token.encode("utf-8")).hex()
    finally:
        crypto.wipe(key)


def carry_grant(key: str, value: object, rk: Rekeying) -> object:
    """A key change's setting rewrite (:class:`~memoriesd.vault.rekey.RekeyParts`): a grant keeps
    working under the new vault key, so it carries the grant subkey of the key its token hash was
    made with (sealed in the log like the hash; it derives nothing else, and opens nothing)."""
    if not key.startswith(SETTING_PREFIX) or not isinstance(value, dict) or "hash_key" in value:
        return value
    sub = rk.store.keys.subkey(crypto.LABEL_GRANTS)
    try:
        return {**value, "hash_key": base64.b64encode(bytes(sub)).decode("ascii")}
    finally:
        crypto.wipe(sub)


def _locked(vault_id: str) -> VaultLocked:
    return VaultLocked(f"the vault of this grant is locked: the person must run `memories vault unlock {vault_id}`")


def _revoked() -> GrantInvalid:
    return GrantInvalid(
        "this grant was revoked or is not valid: the person can create a new one with `memories grant create VAULT_ID`"
    )


# ---------------------------------------------------------------------------- last use


class GrantUses:
    """In-memory `last use` per grant, flushed to the vault now and then and when it locks (one per
    :class:`~memoriesd.server.app.App`, its ``grant_uses``)."""

    def __init__(self, vaults: VaultManager) -> None:
        self.lock = threading.Lock()
        self.last: dict[tuple[str, str], float] = {}
        self.stores: dict[str, VaultStore] = {}
        vaults.on_lock(self.flush)

    def touch(self, store: VaultStore, grant_id: str, rec: dict[str, Any]) -> None:
        t = round(time.time(), 3)
        with self.lock:
            self.last[(store.vault_id, grant_id)] = t
            self.stores[store.vault_id] = store
        if t - float(rec.get("last_used") or 0.0) >= PERSIST_LAST_USE_SECONDS:
            self._persist(store, {grant_id: t})

    def seen(self, vault_id: str, grant_id: str) -> float | None:
        with self.lock:
            return self.last.get((vault_id, grant_id))

    def flush(self, vault_id: str) -> None:
        with self.lock:
            store = self.stores.pop(vault_id, None)
            pending = {g: t for (v, g), t in self.last.items() if v == vault_id}
            for g in pending:
                self.last.pop((vault_id, g), None)
        if store is not None and pending:
            self._persist(store, pending)

    @staticmethod
    def _persist(store: VaultStore, times: dict[str, float]) -> None:
        ops = []
        with store.exclusive():
            if store.closed:
                return
            for gid, t in times.items():
                rec = store.settings.get(SETTING_PREFIX + gid)
                if isinstance(rec, dict) and float(rec.get("last_used") or 0.0) < t:
                    ops.append(Setting(SETTING_PREFIX + gid, dict(rec, last_used=t)))
            try:
                store.commit(ops)
            except MemoriesError:  # a full disk must not fail the read that was served
                log.warning("could not record the last use of a grant")


# ---------------------------------------------------------------------------- verification


class GrantHost(Protocol):
    """What the grant checks use of the application (:class:`memoriesd.server.app.App`)."""

    @property
    def home(self) -> Home: ...

    @property
    def vaults(self) -> VaultManager: ...

    @property
    def grant_uses(self) -> GrantUses: ...


#: The application a grant connection's handler is given (bound: it is a :class:`GrantHost`).
_A = TypeVar("_A", bound=GrantHost)


def verify(app: GrantHost, grant: PresentedGrant) -> tuple[VaultStore, dict[str, Any]]:
    """The unlocked store and grant record, or the error the grant's holder must see."""
    if grant.poisoned:
        raise _revoked()
    store = app.vaults.unlocked_store(grant.vault_id)
    if store is None or store.closed:
        raise _locked(grant.vault_id)
    rec = store.settings.get(SETTING_PREFIX + grant.grant_id)
    ok = isinstance(rec, dict)
    if ok:
        assert isinstance(rec, dict)
        try:
            ok = crypto.mac_equal(bytes.fromhex(_token_hash(store, grant.token, rec)), bytes.fromhex(str(rec.get("hash", ""))))
        except crypto.KeyWiped:  # locked while we looked
            raise _locked(grant.vault_id) from None
    if store.closed:  # locked while we looked: the key was wiped, so say locked, not invalid
        raise _locked(grant.vault_id)
    if not ok:
        raise _revoked()
    assert isinstance(rec, dict)
    expires = rec.get("expires")
    if expires is not None and time.time() >= float(expires):
        raise MemoriesError(
            "this grant has expired: the person can create a new one with `memories grant create VAULT_ID`",
            code="grant_expired",
        )
    return store, rec


def present_grant(app: GrantHost, conn: GrantHolder, params: Params) -> dict[str, Any]:
    """`session.grant {token}`: from now on this connection may do only what the grant allows."""
    if conn.grant is not None:
        raise UsageError("this connection has already presented a grant: open a new connection for another one")
    # Set before anything can fail: whatever happens next, this connection is never an owner's again.
    conn.grant = PresentedGrant("", "", "", poisoned=True)
    token = params.text("token", allow_empty=False, max_len=400)
    parsed = parse_token(token)
    grant = PresentedGrant(parsed.vault_id, parsed.grant_id, token)
    conn.grant = grant
    if not (app.home.vaults / parsed.vault_id).is_dir():
        grant.poisoned = True
        raise _revoked()
    try:
        _store, rec = verify(app, grant)
    except VaultLocked:
        return {"vault_id": grant.vault_id, "grant_id": grant.grant_id, "verified": False, "locked": True}
    except MemoriesError:
        grant.poisoned = True
        raise
    return {
        "vault_id": grant.vault_id,
        "grant_id": grant.grant_id,
        "verified": True,
        "locked": False,
        "scopes": list(rec["scopes"]),
        "cards_only": bool(rec.get("cards_only")),
        "expires": rec.get("expires"),
    }


def presented(ctx: Context) -> PresentedGrant:
    """The grant a request's connection presented (the grant hooks run only on such connections)."""
    if ctx.grant is None:
        raise Internal("a grant check ran on a connection that presented no grant")
    return ctx.grant


def authorize(app: GrantHost, ctx: Context, method_name: str, declared: Method[_A] | None) -> None:
    """Before a handler on a grant connection: scope, vault, validity; rewrite the params."""
    grant = presented(ctx)
    scope = declared.scope if declared is not None else None
    if declared is None or scope is None:
        raise ScopeDenied(
            "a grant may only search, read, retrieve, ask, get context, remember facts, capture conversations and "
            "forget: vault "
            "management, config and other methods need the person's own `memories` CLI"
        )
    store, rec = verify(app, grant)
    raw = ctx.params.raw
    if method_name == "memory.forget" and raw.get("all") is True:
        scope = "forget-all"  # forgetting every fact (or every record of a kind) is its own scope
    if scope not in rec.get("scopes", ()):
        wanted = ",".join(s for s in SCOPES if s in rec.get("scopes", ()) or s == scope or (scope == "forget-all" and s == "forget"))
        raise ScopeDenied(
            f"this grant lacks the {scope} scope: the person can create a grant with it: "
            f"`memories grant create {grant.vault_id} --scope {wanted}`"
        )
    if method_name == "memory.forget" and set(_as_list(raw.get("kind"))) & set(UNSEARCHABLE_KINDS):
        raise ScopeDenied("a grant cannot forget credentials or files: the person can, with `memories memory forget`")
    clean = {k: raw[k] for k in declared.grant_params if k in raw}
    clean["vault"] = grant.vault_id
    if rec.get("cards_only"):
        clean["cards_only"] = True
    ctx.params = Params(clean)

    def still_valid() -> None:
        current, _rec = verify(app, grant)
        if current is not store:  # locked and unlocked again meanwhile: this work belongs to the old key
            raise _locked(grant.vault_id)

    ctx.checks.append(still_valid)
    app.grant_uses.touch(store, grant.grant_id, rec)


def _hidden(rec: Record | None, cards_only: bool) -> bool:
    if rec is None or rec.deleted or rec.private or rec.kind in UNSEARCHABLE_KINDS:
        return True
    return cards_only and rec.kind != "card"


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else [value]


def _lookup(store: VaultStore, record_id: object) -> Record | None:
    try:
        return store.get(str(record_id))
    except NotFound:
        return None


def _missing_like(store: VaultStore, record_id: str, revision: int | None) -> NotFound:
    """Exactly the error the store gives for an id that does not exist (whatever its wording)."""
    probe = new_record_id()
    while store.knows(probe):
        probe = new_record_id()
    try:
        store.get(probe, revision)
    except NotFound as exc:
        return NotFound(exc.message.replace(probe, record_id))
    return NotFound(f"no record {record_id} in this vault")  # pragma: no cover - probe cannot exist


def run_granted(
    app: _A, ctx: Context, method_name: str, handler: Callable[[_A, Context], dict[str, Any]], declared: Method[_A] | None
) -> dict[str, Any]:
    """A grant connection's call: authorize, run, and filter what comes back.

    ``memory.read`` failures are re-worded as for an id that does not exist, so that a hidden
    record cannot be told apart by asking for a revision it lacks.
    """
    authorize(app, ctx, method_name, declared)
    try:
        result = handler(app, ctx)
    except NotFound:
        if method_name != "memory.read":
            raise
        store, _ = verify(app, presented(ctx))
        raise _missing_like(store, str(ctx.params.raw.get("id", "")), ctx.params.raw.get("revision")) from None
    return filter_result(app, ctx, method_name, result)


def filter_result(app: GrantHost, ctx: Context, method_name: str, result: dict[str, Any]) -> dict[str, Any]:
    """After a handler: drop a late result, hide what a grant may never see."""
    store, rec = verify(app, presented(ctx))  # expired, revoked or locked meanwhile: the result is dropped
    cards_only = bool(rec.get("cards_only"))
    if method_name == "memory.read":
        record = _lookup(store, result.get("id"))
        if result.get("private") or result.get("kind") in UNSEARCHABLE_KINDS or _hidden(record, cards_only):
            raise _missing_like(store, str(ctx.params.raw.get("id", "")), ctx.params.raw.get("revision"))
        return {k: result[k] for k in ("id", "revision", "kind", "title", "body", "tags", "created", "updated", "meta") if k in result}
    if method_name in ("memory.search", "rag.search"):
        key = "id" if method_name == "memory.search" else "record_id"
        out = dict(result)
        out["results"] = [r for r in result.get("results", []) if not _hidden(_lookup(store, r.get(key)), cards_only)]
        out.pop("timings_ms", None)
        return out
    if method_name == "rag.context":
        items = result.get("items", [])
        if any(_hidden(_lookup(store, it.get("record_id")), cards_only) for it in items):
            log.error("a context pack held a record hidden from grants; it was withheld")
            return {k: result.get(k) for k in ("query", "budget", "tokenizer", "mode")} | {
                "used_tokens": 0, "items": [], "left_out": 0, "text": "", "notices": []
            }
        return result
    if method_name == "memory.remember":
        return _remember_view(result, rec)
    if method_name == "memory.capture":
        return _capture_view(result, rec)
    if method_name == "memory.forget":
        return _forget_view(store, result, rec)
    if method_name == "rag.ask":
        citations = result.get("citations", [])
        kept = [c for c in citations if not _hidden(_lookup(store, c.get("record_id")), cards_only)]
        if len(kept) != len(citations):  # the answer leaned on something the grant may not see
            log.error("an answer cited a record hidden from grants; it was withheld")
            return {"status": "insufficient_evidence", "answer": "", "mode": result.get("mode"), "citations": [], "notices": []}
        return result
    return result


def _shows_text(rec: dict[str, Any]) -> bool:
    """Whether a write's reply may quote stored text: the grant could read it with another scope."""
    return not rec.get("cards_only") and any(s in rec.get("scopes", ()) for s in TEXT_SCOPES)


def _remember_view(result: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """``memory.remember``'s reply to a grant: what happened; the fact's earlier text only with a text scope."""
    keys = ("action", "id", "revision", "category", "key", "matched_by", "similarity", "notices")
    out = {k: result[k] for k in keys if k in result}
    prev = result.get("previous")
    out["previous"] = None
    if isinstance(prev, dict):
        out["previous"] = {"revision": prev.get("revision")} | ({"text": prev.get("text")} if _shows_text(rec) else {})
    return out


def _capture_view(result: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """``memory.capture``'s reply to a grant: what happened to each session; a stored title only when
    the grant created it or may read stored text; extraction as counts."""
    text = _shows_text(rec)
    rows = []
    for r in result.get("records", []):
        row = {k: r.get(k) for k in ("id", "revision", "status", "session_id", "date", "turns")}
        row["title"] = r.get("title", "") if text or r.get("status") == "created" else ""
        rows.append(row)
    out: dict[str, Any] = {"format": result.get("format"), "records": rows}
    extraction = result.get("extraction")
    out["extraction"] = _extraction_view(extraction) if isinstance(extraction, dict) else None
    return out


def _extraction_view(extraction: dict[str, Any]) -> dict[str, Any]:
    """Which path ran and how much it found: scalars other than text, lists as their lengths."""
    out: dict[str, Any] = {}
    for k, v in extraction.items():
        if isinstance(v, (list, tuple)):
            out[k] = len(v)
        elif isinstance(v, (bool, int, float)) or v is None or (isinstance(v, str) and len(v) <= 40 and k != "summary"):
            out[k] = v
    return out


def _forget_view(store: VaultStore, result: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """``memory.forget``'s reply to a grant: the records (text only with a text scope) and the counts."""
    text = _shows_text(rec)

    def rows(key: str) -> list[dict[str, Any]]:
        out = []
        for r in result.get(key, []):
            row = {k: r.get(k) for k in ("id", "kind", "category", "revisions", "match", "score")}
            if text:
                row.update({"title": r.get("title", ""), "text": r.get("text", "")})
            out.append(row)
        return out

    out: dict[str, Any] = {"dry_run": bool(result.get("dry_run")), "records": rows("records"), "notices": list(result.get("notices", []))}
    if "passed_over" in result:  # a query's: what it did not choose, by kind
        out.update(kinds=result.get("kinds"), passed_over=rows("passed_over"), passed_over_total=result.get("passed_over_total", 0))
    out["forgotten"] = int(result.get("forgotten") or 0)
    out["revisions_removed"] = int(result.get("revisions_removed") or 0)
    return out


def granted_targets(app: GrantHost, ctx: Context, targets: list[Any], named: list[str]) -> list[Any]:
    """What a grant's ``memory.forget`` may take: only records it may see.

    A named id it may not see (private, credential, file, deleted, or missing) is refused exactly
    like an id the vault does not hold; ``all`` and ``--query`` simply skip such records.
    """
    store, rec = verify(app, presented(ctx))
    cards_only = bool(rec.get("cards_only"))
    for rid in named:
        if _hidden(_lookup(store, rid), cards_only):
            raise NotFound(f"no record {rid} in vault {store.name}: see `memories memory list`")
    return [t for t in targets if not _hidden(_lookup(store, t.record.id), cards_only)]



__all__ = [
    "PresentedGrant",
    "GrantUses",
    "SETTING_PREFIX",
    "parse_token",
    "verify",
    "present_grant",
    "authorize",
    "filter_result",
    "granted_targets",
    "SCOPES",
    "WRITE_SCOPES",
    "DEFAULT_SCOPES",
    "TOKEN_PREFIX",
]
