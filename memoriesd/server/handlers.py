"""Vault and record methods of the daemon protocol.

Each handler takes a :class:`Context` and returns a JSON-able dict. Handlers run in worker
threads; the vault store serialises writes itself.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..errors import KeyringUnavailable, UsageError
from ..vault.records import KINDS, Record, new_record_id, now
from ..vault.rekey import RekeyParts
from ..vault.store import Setting, VaultStore, public_header
from .context import Context

Handler = Callable[[Any, Context], dict[str, Any]]
HANDLERS: dict[str, Handler] = {}

MAX_TITLE = 1000
MAX_TAGS = 64
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_FILE_BYTES = 6 * 1024 * 1024
#: Most records one `memory.list` page may hold (without a limit, every record is returned).
MAX_LIST_LIMIT = 100_000


def method(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


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


def _remember(app: Any, store: VaultStore, out: dict[str, Any]) -> None:
    """Keep the unlock secret in the OS keyring; "no keyring" is a normal state, said in a notice."""
    try:
        app.vaults.remember(store)
        out["remembered"] = True
    except KeyringUnavailable as exc:
        out["remembered"] = False
        out["notices"].append(exc.message)


def vault_info(app: Any, vault_id: str) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- daemon


@method("daemon.status")
def daemon_status(app: Any, ctx: Context) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "version": __version__,
        "home": str(app.home.root),
        "uptime_seconds": round(time.monotonic() - app.started, 3),
        "unlocked": [v["vault_id"] for v in app.vaults.list_vaults() if not v["locked"]],
        "config": str(app.home.config_path),
        "restart_pending": app.config_watch.changed(),  # config.toml edited since the daemon started
    }


@method("daemon.stop")
def daemon_stop(app: Any, ctx: Context) -> dict[str, Any]:
    app.request_stop()
    return {"stopping": True}


# ---------------------------------------------------------------------------- vaults


@method("vault.create")
def vault_create(app: Any, ctx: Context) -> dict[str, Any]:
    name = ctx.params.text("name", allow_empty=False, max_len=200)
    remember = ctx.params.flag("remember", False)
    device_only = ctx.params.flag("device_only", False)
    pw = _passphrase(ctx, "passphrase")
    assert pw is not None
    try:
        store = app.vaults.create(name, pw)
    finally:
        _wipe(pw)
    store = app.vaults.use(store.vault_id, ctx)  # a lease: a lock from now on waits for this request
    out: dict[str, Any] = {"vault_id": store.vault_id, "name": store.name, "notices": []}
    if device_only:
        store.commit([Setting("policy.device_only", True)])
    out["device_only"] = device_only
    if remember:
        _remember(app, store, out)
    return out


@method("vault.list")
def vault_list(app: Any, ctx: Context) -> dict[str, Any]:
    return {"vaults": app.vaults.list_vaults()}


@method("vault.status")
def vault_status(app: Any, ctx: Context) -> dict[str, Any]:
    ref = ctx.params.text("vault", None)
    if ref is None:
        return {"vaults": [vault_info(app, v["vault_id"]) for v in app.vaults.list_vaults()]}
    return vault_info(app, app.vaults.resolve(ref))


@method("vault.unlock")
def vault_unlock(app: Any, ctx: Context) -> dict[str, Any]:
    ref = ctx.params.text("vault", allow_empty=False)
    remember = ctx.params.flag("remember", False)
    pw = _passphrase(ctx, "passphrase", required=False)
    try:
        store = app.vaults.unlock(ref, pw)
    finally:
        _wipe(pw)
    out: dict[str, Any] = {"vault_id": store.vault_id, "name": store.name, "locked": False, "notices": []}
    if remember:
        _remember(app, app.vaults.use(store.vault_id, ctx), out)
    return out


@method("vault.lock")
def vault_lock(app: Any, ctx: Context) -> dict[str, Any]:
    """``locked``: the vaults this request locked; ``already_locked``: those that were locked before it."""
    if ctx.params.flag("all", False):
        locked = app.vaults.lock_all()
        others = [v["vault_id"] for v in app.vaults.list_vaults() if v["vault_id"] not in locked]
        return {"locked": locked, "already_locked": others}
    vault_id = app.vaults.resolve(ctx.params.text("vault", allow_empty=False))
    if app.vaults.lock(vault_id):
        return {"locked": [vault_id], "already_locked": []}
    return {"locked": [], "already_locked": [vault_id]}


@method("vault.passwd")
def vault_passwd(app: Any, ctx: Context) -> dict[str, Any]:
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
    finally:
        _wipe(old, new)
    return {"vault_id": app.vaults.resolve(ref), "changed": True, "rekeyed": rekey, **out}


def rekey_parts() -> RekeyParts:
    """What a key change does beside the log: grants keep working, sealed vectors and recall
    counters are sealed again under the new key (every other derived file is rebuilt)."""
    from ..index.vectors.maintenance import rekey_vectors
    from ..memory.recalls import rekey_recalls
    from .grants import carry_grant

    return RekeyParts(setting=carry_grant, stage=(rekey_vectors, rekey_recalls))


@method("vault.delete")
def vault_delete(app: Any, ctx: Context) -> dict[str, Any]:
    notices: list[str] = []
    out: dict[str, Any] = {"deleted": app.vaults.delete(ctx.params.text("vault", allow_empty=False), notices)}
    if notices:
        out["notices"] = notices  # the remembered key could not be removed from the OS keyring
    return out


@method("vault.compact")
def vault_compact(app: Any, ctx: Context) -> dict[str, Any]:
    store = app.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)
    t0 = time.perf_counter()
    stats: dict[str, Any] = dict(store.compact(app.config.vault.keep_revisions))
    if app.rag is not None:
        # Sealed vectors are derived from records: drop those of deleted records and old revisions too.
        from ..index.vectors.maintenance import compact_vectors

        stats.update(compact_vectors(store, app.rag.peek_index(store)))
    # So is the sealed lexical snapshot: rewritten from the purged index, or removed.
    from ..index.caches import compact_lexical

    stats.update(compact_lexical(store, app.rag.peek_index(store) if app.rag is not None else None))
    stats["seconds"] = round(time.perf_counter() - t0, 4)
    stats["vault_id"] = store.vault_id
    return stats


@method("vault.policy")
def vault_policy(app: Any, ctx: Context) -> dict[str, Any]:
    store = app.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)
    device_only = ctx.params.flag("device_only", None)
    if device_only is not None:
        store.commit([Setting("policy.device_only", device_only)])
    extract = ctx.params.flag("extract", None)  # conversations.extract: extraction after capture
    if extract is not None:
        store.commit([Setting("policy.extract", extract)])
    return {
        "vault_id": store.vault_id,
        "device_only": bool(store.settings.get("policy.device_only", False)),
        "extract": bool(store.settings.get("policy.extract", True)),
    }


# ---------------------------------------------------------------------------- records


def _tags(values: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for t in values:
        t = t.strip()
        if not t or len(t) > 100:
            raise UsageError("a tag must be 1 to 100 characters")
        if t not in out:
            out.append(t)
    if len(out) > MAX_TAGS:
        raise UsageError(f"at most {MAX_TAGS} tags per record")
    return tuple(out)


def _check_body(body: str) -> None:
    if len(body.encode("utf-8")) > MAX_BODY_BYTES:
        raise UsageError(f"the text is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB: split it into several records")


def _store_for_write(app: Any, ctx: Context) -> VaultStore:
    return app.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)


@method("memory.add")
def memory_add(app: Any, ctx: Context) -> dict[str, Any]:
    p = ctx.params
    store = _store_for_write(app, ctx)
    kind = p.choice("kind", ("memory", "credential", "file"), "memory")
    title = p.text("title", "", max_len=MAX_TITLE)
    tags = _tags(p.texts("tags", []))
    private = p.flag("private", False)
    meta: dict[str, Any] = {}
    if kind == "file":
        data_b64 = p.text("data", allow_empty=True)
        try:
            raw = base64.b64decode(data_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise UsageError("the file data is not valid base64") from exc
        if len(raw) > MAX_FILE_BYTES:
            raise UsageError(f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: file resources are limited to that")
        body = data_b64
        meta["filename"] = p.text("filename", "", max_len=255)
        title = title or meta["filename"]
    else:
        body = p.text("body")
        _check_body(body)
        if not body.strip() and not title:
            raise UsageError("the record is empty: give it a text or a title")
    t = now()
    rec = Record(new_record_id(), 1, kind, title, body, private, tags, meta=meta, created=t, updated=t)
    store.commit([rec])
    _changed(app, store, rec)
    return rec.summary()


def _changed(app: Any, store: VaultStore, rec: Record) -> None:
    """A searchable record changed: the background indexer embeds its fragments."""
    if rec.searchable and app.rag is not None:
        app.rag.background.request(store.vault_id)


@method("memory.read")
def memory_read(app: Any, ctx: Context) -> dict[str, Any]:
    store = app.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)
    rec = store.get(ctx.params.text("id", allow_empty=False), ctx.params.integer("revision", None, lo=1))
    out = rec.full()
    if rec.kind == "file" and ctx.params.flag("with_data", False):
        out["data"] = rec.body
    return out


@method("memory.history")
def memory_history(app: Any, ctx: Context) -> dict[str, Any]:
    store = app.vaults.use(ctx.params.text("vault", allow_empty=False), ctx)
    revs = store.history(ctx.params.text("id", allow_empty=False))
    return {
        "id": revs[0].id,
        "revisions": [
            {"revision": r.revision, "updated": r.updated, "deleted": r.deleted, "title": r.title}
            | ({"text": r.body} if r.kind == "fact" else {})  # a fact has no title: its history is its text
            for r in revs
        ],
    }


@method("memory.list")
def memory_list(app: Any, ctx: Context) -> dict[str, Any]:
    """Records newest first, one page of them: ``limit``/``offset`` page, ``kind``/``tag``/``since`` filter.

    Without ``limit`` every record is returned (scripts rely on it); ``total`` counts the records that
    pass the filters, so a client can say "showing 1-50 of 5,183".
    """
    from ..rag.filters import parse_day, record_day

    p = ctx.params
    store = app.vaults.use(p.text("vault", allow_empty=False), ctx)
    kind = p.choice("kind", KINDS, None)
    tag = p.text("tag", None, max_len=100)
    since_text = p.text("since", None, max_len=40)
    since = parse_day(since_text, "--since") if since_text is not None else None
    limit = p.integer("limit", None, lo=1, hi=MAX_LIST_LIMIT)
    offset = p.integer("offset", 0, lo=0)
    wanted_tag = tag.strip().casefold() if tag is not None else None
    recs = [
        r
        for r in store.latest()
        if (kind is None or r.kind == kind)
        and (wanted_tag is None or any(t.casefold() == wanted_tag for t in r.tags))
        and (since is None or record_day(r) >= since)
    ]
    recs.sort(key=lambda r: (-r.updated, r.id))
    page = recs[offset:] if limit is None else recs[offset : offset + limit]
    # ``source``: a card's file (absolute path), as search results name it; None for other records.
    records = [r.summary() | {"source": r.meta.get("source") or r.meta.get("path") or None} for r in page]
    return {"records": records, "total": len(recs), "offset": offset, "limit": limit}


@method("memory.update")
def memory_update(app: Any, ctx: Context) -> dict[str, Any]:
    p = ctx.params
    store = _store_for_write(app, ctx)
    with store.lock:
        rec = store.get(p.text("id", allow_empty=False))
        if rec.kind == "file" and p.text("body", None) is not None:
            raise UsageError("a file resource's bytes cannot be replaced by text: add a new file resource instead")
        title = p.text("title", None, max_len=MAX_TITLE)
        body = p.text("body", None)
        if body is not None:
            _check_body(body)
        tags = list(rec.tags)
        for t in _tags(p.texts("tags", [])):
            if t not in tags:
                tags.append(t)
        untag = set(p.texts("untag", []))
        tags = [t for t in tags if t not in untag]
        private = p.flag("private", None)
        new = Record(
            rec.id,
            rec.revision + 1,
            rec.kind,
            rec.title if title is None else title,
            rec.body if body is None else body,
            rec.private if private is None else private,
            _tags(tags),
            meta=rec.meta,
            private_meta=rec.private_meta,
            created=rec.created,
            updated=now(),
        )
        store.commit([new])
    _changed(app, store, new)
    return new.summary()


@method("memory.delete")
def memory_delete(app: Any, ctx: Context) -> dict[str, Any]:
    store = _store_for_write(app, ctx)
    with store.lock:
        rec = store.get(ctx.params.text("id", allow_empty=False))
        tomb = Record(rec.id, rec.revision + 1, rec.kind, "", "", rec.private, (), created=rec.created, updated=now(), deleted=True)
        store.commit([tomb])
    return {"id": rec.id, "deleted": True, "revision": tomb.revision}
