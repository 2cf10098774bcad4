"""Record types kept in a vault (plaintext only ever in daemon memory)."""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass, field, fields
from typing import Any

KINDS = ("memory", "card", "fact", "credential", "file", "conversation")
# Kinds that are never indexed, never returned by search, never sent anywhere.
UNSEARCHABLE_KINDS = ("credential", "file")


def new_record_id() -> str:
    """Short random id: 16 base32 characters (80 bits), lower case."""
    return base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()


def now() -> float:
    return round(time.time(), 3)


@dataclass(frozen=True)
class Record:
    """One revision of a record."""

    id: str
    revision: int
    kind: str
    title: str
    body: str  # UTF-8 text; for kind "file", base64 of the bytes
    private: bool
    tags: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)  # safe metadata (source, front matter...)
    private_meta: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    deleted: bool = False
    # Sync (memoriesd.sync): the version's stamp ("<hlc hex>-<device>"), the stamps it was made from, and
    # whether it is a *conflict revision* (kept, shown by history, never current). Empty for a vault
    # that has never synced: entries carry them only when set ("v", "p", "c").
    version: str = ""
    parents: tuple[str, ...] = ()
    conflict: bool = False

    @property
    def searchable(self) -> bool:
        return not self.deleted and not self.private and self.kind not in UNSEARCHABLE_KINDS

    def to_entry(self) -> dict[str, Any]:
        out = self._entry()
        if self.version:
            out["v"] = self.version
            out["p"] = list(self.parents)
            if self.deleted:  # a synced tombstone may be all a device keeps of a record: it names its kind
                out["kind"] = self.kind
        if self.conflict:
            out["c"] = 1
        return out

    def _entry(self) -> dict[str, Any]:
        if self.deleted:
            return {"t": "del", "id": self.id, "rev": self.revision, "updated": self.updated}
        return {
            "t": "put",
            "id": self.id,
            "rev": self.revision,
            "kind": self.kind,
            "title": self.title,
            "body": self.body,
            "private": self.private,
            "tags": list(self.tags),
            "meta": self.meta,
            "pmeta": self.private_meta,
            "created": self.created,
            "updated": self.updated,
        }

    @staticmethod
    def from_entry(entry: dict[str, Any], previous: Record | None) -> Record:
        if entry["t"] == "del":
            version = entry.get("v")
            if previous is None:  # a synced tombstone kept alone (compaction, or a record never had here)
                assert version, "delete of unknown record"
            return Record(
                id=str(entry["id"]) if previous is None else previous.id,
                revision=int(entry["rev"]),
                kind=previous.kind if previous is not None else str(entry.get("kind") or "memory"),
                title="",
                body="",
                private=previous.private if previous is not None else False,
                tags=(),
                created=previous.created if previous is not None else float(entry["updated"]),
                updated=float(entry["updated"]),
                deleted=True,
                version=str(version) if version else "",
                parents=tuple(str(x) for x in entry.get("p") or ()),
                conflict=bool(entry.get("c")),
            )
        tags, meta, pmeta = entry["tags"], entry.get("meta"), entry.get("pmeta")
        values: dict[str, Any] = {
            "id": str(entry["id"]),
            "revision": int(entry["rev"]),
            "kind": str(entry["kind"]),
            "title": str(entry["title"]),
            "body": str(entry["body"]),
            "private": bool(entry["private"]),
            "tags": tuple([str(t) for t in tags]) if tags else (),
            "meta": dict(meta) if meta else {},
            "private_meta": dict(pmeta) if pmeta else {},
            "created": float(entry["created"]),
            "updated": float(entry["updated"]),
            "deleted": False,
            "version": "",
            "parents": (),
            "conflict": False,
        }
        if "v" in entry:
            values["version"] = str(entry["v"])
            values["parents"] = tuple(str(x) for x in entry.get("p") or ())
        if entry.get("c"):
            values["conflict"] = True
        if not _FAST_INIT:
            return Record(**values)
        # Unlock makes one per log entry: without the frozen dataclass's per-field __setattr__ calls
        # (less than half the cost). The same fields and values: equal and hashing alike.
        rec = _new(Record)
        _set(rec, "__dict__", values)
        return rec

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "revision": self.revision,
            "kind": self.kind,
            "title": self.title,
            "tags": list(self.tags),
            "private": self.private,
            "updated": self.updated,
        }

    def full(self) -> dict[str, Any]:
        out = self.summary()
        out.update(
            {
                "body": self.body if self.kind != "file" else "",
                "created": self.created,
                "meta": self.meta,
            }
        )
        if self.kind == "file":
            out["size"] = len(base64.b64decode(self.body)) if self.body else 0
            out["filename"] = self.meta.get("filename", "")
        return out


_new = object.__new__
_set = object.__setattr__
# from_entry fills every field itself: only while that stays true (a field added to Record falls
# back to the constructor, with its default).
_FAST_INIT = {f.name for f in fields(Record)} == {
    "id", "revision", "kind", "title", "body", "private", "tags", "meta", "private_meta", "created", "updated", "deleted",
    "version", "parents", "conflict",
}
