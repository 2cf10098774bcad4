"""Protocol method ``memory.capture``: store a finished conversation (logic in :mod:`memoriesd.conversations`).

params: ``vault``, ``text`` (the whole file as a string: the CLI reads the file or stdin), ``format``
(auto, jsonl, markdown, locomo), ``title``, ``date`` (ISO), ``session_id``, ``extract`` (default
true). result: ``{"format", "records": [{id, revision, status, title, session_id, date, turns}],
"extraction"}``. A grant connection may call it with the ``capture`` scope (its ``scope`` in METHODS below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...conversations.capture import capture
from ...conversations.transcripts import FORMATS, parse
from ...vault.live import VaultLock
from ..context import Context
from ..method import Method
from .records import MAX_TITLE, _changed

if TYPE_CHECKING:
    from ..app import App


def memory_capture(app: App, ctx: Context) -> dict[str, Any]:
    """Parse the conversation(s) in ``text`` and store each session as a record (created, unchanged
    or revised); then extraction, when asked and allowed (the hook at the end)."""
    p = ctx.params
    vault = app.lease(ctx)
    store = vault.store
    text = p.text("text", allow_surrogates=True)  # parse() refuses a lone surrogate, naming its line
    fmt = p.choice("format", FORMATS, "auto")
    title = p.text("title", None, max_len=MAX_TITLE)
    date = p.text("date", None, max_len=100)
    session_id = p.text("session_id", None, max_len=200)
    extract = p.flag("extract", True)
    convs = parse(text, fmt, title=title or None, date=date or None, session_id=session_id or None)
    ctx.check_cancelled()
    with vault.hold(VaultLock.CAPTURE):
        done = capture(store, convs, title_given=bool(title), skip_private=ctx.grant is not None, check=ctx.check_cancelled)
    changed = [c for c in done if c.status != "unchanged"]
    if changed:
        _changed(app, store, changed[0].record)  # one request embeds every changed record of the vault
    out: dict[str, Any] = {
        "format": convs[0].format,
        "records": [c.to_dict() for c in done],
        "extraction": None,
    }
    # extraction hook: for the created/revised records (``changed``), when ``extract`` is true and the
    # vault's policy allows it, the extraction result goes into out["extraction"].
    if extract and changed:
        from .extract import after_capture

        latest = {c.record.id: c.record for c in changed}  # a session twice in one file: its last revision
        out["extraction"] = after_capture(app, vault, list(latest.values()), ctx)
    return out



#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.capture", memory_capture, scope="capture", owner_only=False, grant_params=('text', 'format', 'title', 'date', 'session_id', 'extract')),
]

__all__ = ["memory_capture"]
