"""Storing parsed conversations: one record of kind ``conversation`` per session.

The record's body is the turns rendered ``{speaker}: {text}``, joined by a blank line; its
metadata (encrypted like all metadata) holds ``speakers``, ``session_date`` / ``session_when``
(indexed, so BM25 and the embedder see who and when) and ``conversation``: session id, format,
the date as given, a hash of the turns and each turn's byte range, speaker, time and source id
(:func:`memoriesd.conversations.model.meta_for`).

Capturing is idempotent per session. The session key is the session id when there is one (given,
Claude Code ``sessionId``, a LoCoMo sample and session number), else a hash of the first turn and
the date. The same key with the same turns changes nothing (``unchanged``); with other turns (the
session went on) it is a new revision of the same record (``revised``); a new key is a new record
(``created``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..kinds.turns import KIND
from ..vault.records import Record, new_record_id, now
from ..vault.store import VaultStore
from .model import Conversation, meta_for, session_day

#: Largest record body (the same bound as `memory add`: server.methods.records.MAX_BODY_BYTES).
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Captured:
    """What capture did with one conversation."""

    record: Record
    status: str  # created | unchanged | revised
    turns: int

    def to_dict(self) -> dict[str, Any]:
        conv = self.record.meta.get("conversation") or {}
        return {
            "id": self.record.id,
            "revision": self.record.revision,
            "status": self.status,
            "title": self.record.title,
            "session_id": conv.get("session_id"),
            "date": self.record.meta.get("session_date"),
            "turns": self.turns,
        }


def session_key(conv: Conversation) -> str:
    """Which stored record a conversation is (a new revision of) — see the module docstring."""
    if conv.session_id:
        return "id:" + conv.session_id
    first = conv.turns[0]
    canon = json.dumps([first.speaker, first.text, first.time, session_day(conv.date)], ensure_ascii=False)
    return "h:" + hashlib.sha256(canon.encode("utf-8")).hexdigest()[:32]


def _key_of(rec: Record) -> str | None:
    conv = rec.meta.get("conversation")
    key = conv.get("key") if isinstance(conv, dict) else None
    return key if isinstance(key, str) else None


def _sha_of(rec: Record) -> str | None:
    conv = rec.meta.get("conversation")
    return conv.get("content_sha256") if isinstance(conv, dict) else None


def capture(
    store: VaultStore,
    convs: list[Conversation],
    *,
    title_given: bool = False,
    skip_private: bool = False,
    check: Callable[[], None] = lambda: None,
) -> list[Captured]:
    """Store ``convs`` (one commit for all of them). A revision keeps the record's title, tags and
    privacy unless ``title_given`` (then the new title is the conversation's). ``skip_private`` (a
    grant's capture): a private record is never matched, so never revised nor shown."""
    prepared: list[tuple[Conversation, str, str, dict[str, Any]]] = []
    for conv in convs:
        body, spans = conv.body_and_spans()
        size = len(body.encode("utf-8"))
        if size > MAX_BODY_BYTES:
            raise UsageError(
                f"the conversation {conv.title[:60]!r} is {size / 2**20:.1f} MiB of text, over the "
                f"{MAX_BODY_BYTES // 2**20} MiB a record holds: split it into several files"
            )
        key = session_key(conv)
        prepared.append((conv, key, body, meta_for(conv, key, spans)))
    check()
    out: list[Captured] = []
    with store.exclusive():
        existing: dict[str, Record] = {}
        for rec in store.latest():
            if rec.kind == KIND and not (skip_private and rec.private) and (k := _key_of(rec)) is not None:
                existing[k] = rec
        writes: list[Record] = []
        t = now()
        for conv, key, body, meta in prepared:
            old = existing.get(key)
            if old is not None and _sha_of(old) == meta["conversation"]["content_sha256"]:
                out.append(Captured(old, "unchanged", len(conv.turns)))
                continue
            if old is None:
                rec = Record(new_record_id(), 1, KIND, conv.title, body, False, (), meta=meta, created=t, updated=t)
                status = "created"
            else:
                title = conv.title if title_given else old.title
                rec = Record(old.id, old.revision + 1, KIND, title, body, old.private, old.tags, meta=meta,
                             private_meta=old.private_meta, created=old.created, updated=t)
                status = "revised"
            existing[key] = rec
            writes.append(rec)
            out.append(Captured(rec, status, len(conv.turns)))
        if writes:  # a session twice in one file: both revisions, in order
            # Under the lock `grant revoke` also takes: a grant revoked or expired by now (or a client
            # gone) writes nothing; one revoked after the commit finds the records committed.
            check()
            store.commit(writes)
    return out


__all__ = ["Captured", "MAX_BODY_BYTES", "capture", "session_key"]
