"""Record methods of the protocol: ``memory.add``, ``read``, ``history``, ``list``, ``update``, ``delete``.

Each handler takes the :class:`~memoriesd.server.app.App` and a :class:`Context` and returns a
JSON-able dict. Handlers run in worker threads; the vault store serialises writes itself.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from ...errors import NotFound, UsageError
from ...vault.records import KINDS, Record, new_record_id, now
from ...vault.store import VaultStore
from ...vault.versions import heads, versions
from ..context import Context
from ..method import Method

if TYPE_CHECKING:
    from ..app import App

MAX_TITLE = 1000
MAX_TAGS = 64
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_FILE_BYTES = 6 * 1024 * 1024
#: Most records one `memory.list` page may hold (without a limit, every record is returned).
MAX_LIST_LIMIT = 100_000


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


def _store_for_write(app: App, ctx: Context) -> VaultStore:
    return app.lease(ctx).store


def memory_add(app: App, ctx: Context) -> dict[str, Any]:
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


def _changed(app: App, store: VaultStore, rec: Record) -> None:
    """A searchable record changed: the background indexer embeds its fragments."""
    if rec.searchable and app.rag is not None:
        app.rag.background.request(store.vault_id)


def memory_read(app: App, ctx: Context) -> dict[str, Any]:
    """A record by its ``id``, or the card ingested from ``path`` (as typed; ``absolute``: the same path
    made absolute by the client, which knows its working directory)."""
    store = app.lease(ctx).store
    path = ctx.params.text("path", None, max_len=4096)
    if path is not None and ctx.params.text("id", None) is None:
        record_id = card_by_path(store, path, ctx.params.text("absolute", None, max_len=4096)).id
    else:
        record_id = ctx.params.text("id", allow_empty=False)
    rec = store.get(record_id, ctx.params.integer("revision", None, lo=1))
    out = rec.full()
    if rec.kind == "file" and ctx.params.flag("with_data", False):
        out["data"] = rec.body
    return out


def card_by_path(store: VaultStore, path: str, absolute: str | None = None) -> Record:
    """The card ingested from ``path``: the one whose source file is ``absolute``, else the one whose
    source path ends with ``path`` (whole components: ``notes/chsh.md`` matches ``~/tldr/notes/chsh.md``,
    never ``~/tldr/mynotes/chsh.md``). Several candidates: ask for more of the path."""
    cards = [r for r in store.latest() if r.kind == "card" and r.meta.get("source")]
    if absolute:
        exact = [r for r in cards if str(r.meta["source"]) == absolute]
        if exact:
            return exact[0]
    want = tuple(part for part in PurePosixPath(path.replace("\\", "/")).parts if part not in (".", "/"))
    if not want:
        raise UsageError("give the path of an ingested file, e.g. notes/chsh.md")
    found = [r for r in cards if PurePosixPath(str(r.meta["source"])).parts[-len(want):] == want]
    if len(found) == 1:
        return found[0]
    name = store.name
    if not found:
        raise NotFound(
            f"no card of vault {name} was ingested from a file at {path}: `memories memory list {name} --kind card` "
            "lists the cards with their source files"
        )
    shown = ", ".join(sorted(str(r.meta.get("path") or r.meta["source"]) for r in found)[:3])
    raise UsageError(
        f"{len(found):,} cards of vault {name} were ingested from files at {path} ({shown}"
        f"{', ...' if len(found) > 3 else ''}): give more of the path, or the absolute path"
    )


def memory_history(app: App, ctx: Context) -> dict[str, Any]:
    store = app.lease(ctx).store
    revs = store.history(ctx.params.text("id", allow_empty=False))
    conflicts = store.conflicts.get(revs[0].id, [])
    known = versions(revs, conflicts, "")
    current = revs[-1].version
    unresolved = {s for s in heads(known) if s != current} if current else set()

    def row(r: Record) -> dict[str, Any]:
        out = {"revision": r.revision, "updated": r.updated, "deleted": r.deleted, "title": r.title}
        if r.kind == "fact":  # a fact has no title: its history is its text
            out["text"] = r.body
        if r.conflict:  # a concurrent edit from another device that did not win (sync): kept
            out["conflict"] = True
            out["body"] = r.body
        if r.version:
            out["device"] = r.version.partition("-")[2]
            if r.version in unresolved and r is known[r.version].record:
                out["unresolved"] = True  # a head no later edit named: `sync status` lists the record
        return out

    return {"id": revs[0].id, "revisions": [row(r) for r in revs] + [row(r) for r in conflicts]}


def memory_list(app: App, ctx: Context) -> dict[str, Any]:
    """Records newest first, one page of them: ``limit``/``offset`` page, ``kind``/``tag``/``since`` filter.

    Without ``limit`` every record is returned (scripts rely on it); ``total`` counts the records that
    pass the filters, so a client can say "showing 1-50 of 5,183".
    """
    from ...rag.filters import parse_day, record_day

    p = ctx.params
    store = app.lease(ctx).store
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
    # ``text``: a fact's text (a fact has no title: it is listed by its text, as its history is).
    records = [
        r.summary() | {"source": r.meta.get("source") or r.meta.get("path") or None} | ({"text": r.body} if r.kind == "fact" else {})
        for r in page
    ]
    return {"records": records, "total": len(recs), "offset": offset, "limit": limit}


def memory_update(app: App, ctx: Context) -> dict[str, Any]:
    p = ctx.params
    store = _store_for_write(app, ctx)
    with store.exclusive():
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


def memory_delete(app: App, ctx: Context) -> dict[str, Any]:
    store = _store_for_write(app, ctx)
    with store.exclusive():
        rec = store.get(ctx.params.text("id", allow_empty=False))
        tomb = Record(rec.id, rec.revision + 1, rec.kind, "", "", rec.private, (), created=rec.created, updated=now(), deleted=True)
        store.commit([tomb])
    return {"id": rec.id, "deleted": True, "revision": tomb.revision}


#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.add", memory_add),
    Method("memory.read", memory_read, scope="read", owner_only=False, grant_params=('id', 'revision')),
    Method("memory.history", memory_history),
    Method("memory.list", memory_list),
    Method("memory.update", memory_update),
    Method("memory.delete", memory_delete),
]
