"""Protocol method ``memory.extract`` and the extraction that follows ``memory.capture``.

Logic in :mod:`memoriesd.memory.extract`. ``memory.extract`` {vault, record, path: auto,
model, patterns} is the person's own command (not in the grant allowlist); it runs whatever the
vault's ``policy.extract`` switch says, since the person asked for it by name. :func:`after_capture`
is what ``memory.capture`` calls for the records it created or revised: nothing when the switch is
off (the reply says so), a private record is skipped, a grant without the ``ask`` scope gets the
pattern rules only, and a failure (a malformed reply, a service that does not answer) is reported
in the result without undoing the capture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import MemoriesError
from ...memory.extract import MAX_SEND_TOKENS, PATHS, ExtractRequest, extract, extract_enabled
from ...vault.live import LiveVault
from ...vault.records import Record
from ..context import Context
from ..method import Method

if TYPE_CHECKING:
    from ..app import App
#: Most records of one capture sent to the generation service; the others get the pattern rules.
MAX_MODEL_RECORDS = 16
OFF_NOTICE = "extraction is off for this vault: nothing was extracted (`memories vault policy VAULT --extract` turns it on)"


def memory_extract(app: App, ctx: Context) -> dict[str, Any]:
    """Extract facts (and with a model, a summary) from one conversation record."""
    p = ctx.params
    vault = app.lease(ctx)
    store = vault.store
    req = ExtractRequest(p.text("record", allow_empty=False, max_len=100), p.choice("path", PATHS, "auto"))
    out = extract(app, vault, req, ctx)
    if not extract_enabled(store):
        out["notices"].append("extraction after capture is off for this vault; this record was extracted because you asked for it")
    return out


def _grant_may_ask(app: App, ctx: Context) -> bool:
    if ctx.grant is None:
        return True
    from ..grants import verify

    _store, rec = verify(app, ctx.grant)
    return "ask" in rec.get("scopes", ())


def after_capture(app: App, vault: LiveVault, records: list[Record], ctx: Context) -> dict[str, Any]:
    """The ``extraction`` of a ``memory.capture`` reply for the records it created or revised:
    ``{path, summary, facts, rejected, notices, records: [{id, revision, path, facts, summary?, error?}]}``."""
    store = vault.store
    if not extract_enabled(store):
        return {"path": "off", "summary": None, "facts": [], "rejected": 0, "notices": [OFF_NOTICE], "records": []}
    may_ask = _grant_may_ask(app, ctx)
    facts: list[dict[str, Any]] = []
    notices: list[str] = []
    per: list[dict[str, Any]] = []
    paths: list[str] = []
    rejected = 0
    for i, rec in enumerate(records):
        if rec.private:
            per.append({"id": rec.id, "revision": rec.revision, "path": "off", "facts": 0})
            notices.append(f"conversation {rec.id} is private: nothing was extracted from it")
            continue
        path = "auto" if i < MAX_MODEL_RECORDS else "patterns"
        req = ExtractRequest(rec.id, path, skip_private=ctx.grant is not None, model_allowed=may_ask)
        try:
            got = extract(app, vault, req, ctx)
        except MemoriesError as exc:
            per.append({"id": rec.id, "revision": rec.revision, "path": "failed", "facts": 0,
                        "error": {"code": exc.code, "message": exc.message}})
            notices.append(f"conversation {rec.id}: {exc.message}")
            if exc.code in ("vault_locked", "cancelled"):
                break
            continue
        paths.append(got["path"])
        facts.extend({**f, "conversation": rec.id} for f in got["facts"])
        rejected += got["rejected"]
        notices.extend(n for n in got["notices"] if n not in notices)
        per.append({"id": rec.id, "revision": rec.revision, "path": got["path"], "facts": len(got["facts"]), "summary": got["summary"]})
    if len(records) > MAX_MODEL_RECORDS and "model" in paths:
        notices.append(
            f"only the first {MAX_MODEL_RECORDS} sessions of this capture were sent to the model (at most "
            f"{MAX_SEND_TOKENS:,} tokens each); the others got the pattern rules: `memories memory extract` sends one"
        )
    kinds = sorted(set(paths))
    return {
        "path": kinds[0] if len(kinds) == 1 else ("+".join(kinds) if kinds else "failed"),
        "summary": per[0].get("summary") if len(per) == 1 else None,
        "facts": facts,
        "rejected": rejected,
        "notices": notices,
        "records": per,
    }



#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.extract", memory_extract),
]

__all__ = ["after_capture", "memory_extract"]
