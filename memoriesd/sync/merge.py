"""Merging versions received from other devices into this device's log, without losing any.

Each record's versions form a graph (a version names the stamps it was made from, see
:mod:`memoriesd.vault.versions`). Whatever order versions arrive in, every device ends with the same
set of versions and so the same *heads*; the current revision is the head with the highest stamp
(hybrid logical clock, then device id), and the other heads are *conflict revisions*: kept in the log
(``"c": 1``), shown by ``memory history`` and ``sync status``, never current, until an edit made after
seeing them (whose parents name them) resolves them. A version that arrives after a version made
from it is kept the same way (history), and changes nothing current.

:func:`plan` reads the store and returns the revisions that make it so; the engine commits them
under ``store.exclusive()`` so no local write comes between. Forgets are not merged here: a forget
wins over every version (:mod:`memoriesd.sync.engine` purges).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..vault.records import KINDS, Record
from ..vault.store import VaultStore
from ..vault.versions import Version, current_stamp, heads, versions
from .stamps import valid_stamp

#: Keys of a version as it travels (a log entry without the local revision number).
WIRE_PUT = ("t", "id", "kind", "title", "body", "private", "tags", "meta", "pmeta", "created", "updated", "v", "p")


class BadVersion(ValueError):
    """A version that is not well formed (never applied; the segment holding it is reported)."""


def to_wire(rec: Record, stamp: str, parents: Iterable[str]) -> dict[str, Any]:
    """A revision as it travels: its entry without the local revision number, with stamp and parents."""
    entry = rec.to_entry()
    entry.pop("rev", None)
    entry.pop("c", None)
    if rec.deleted:  # a device that first meets the record as this tombstone keeps its kind
        entry["kind"] = rec.kind
    entry["v"], entry["p"] = stamp, list(parents)
    return entry


def check_wire(entry: object) -> dict[str, Any]:
    """A received version, checked field by field (:class:`BadVersion` when malformed)."""
    if not isinstance(entry, dict):
        raise BadVersion("not an object")
    t = entry.get("t")
    if t not in ("put", "del") or not isinstance(entry.get("id"), str) or not 1 <= len(entry["id"]) <= 64:
        raise BadVersion("type or id")
    if not valid_stamp(entry.get("v")) or not isinstance(entry.get("p"), list) or not all(valid_stamp(x) for x in entry["p"]):
        raise BadVersion("stamp")
    if not isinstance(entry.get("updated"), (int, float)):
        raise BadVersion("time")
    if t == "del" and entry.get("kind", "memory") not in KINDS:
        raise BadVersion("kind")
    if t == "put":
        if entry.get("kind") not in KINDS or not isinstance(entry.get("title"), str) or not isinstance(entry.get("body"), str):
            raise BadVersion("record")
        if not isinstance(entry.get("private"), bool) or not isinstance(entry.get("tags"), list):
            raise BadVersion("record")
        if not isinstance(entry.get("meta"), dict) or not isinstance(entry.get("pmeta", {}), dict):
            raise BadVersion("record")
        if not isinstance(entry.get("created"), (int, float)):
            raise BadVersion("record")
    return entry


@dataclass
class _Overlay:
    """One record's state while a plan is made: the store's, plus the plan's entries so far."""

    revs: list[Record]
    known: dict[str, Version]
    last_rev: int


@dataclass
class Plan:
    """What merging a batch of versions does: entries to commit and what they mean."""

    records: list[Record] = field(default_factory=list)  # to commit, in order
    applied: int = 0  # versions that became current
    kept: int = 0  # versions kept as conflict revisions or history
    duplicates: int = 0  # versions this device already had
    conflicts: set[str] = field(default_factory=set)  # record ids that now have more than one head
    changed: set[str] = field(default_factory=set)  # record ids whose current revision changed


def _record(entry: dict[str, Any], rev: int, previous: Record | None, conflict: bool) -> Record:
    local = {**entry, "rev": rev}
    if conflict:
        local["c"] = 1
    return Record.from_entry(local, previous)


def plan(store: VaultStore, device: str, incoming: Iterable[dict[str, Any]], forgotten: set[str]) -> Plan:
    """The entries that merge ``incoming`` (checked wire versions) into ``store``. Caller holds
    ``store.exclusive()`` until the entries are committed."""
    out = Plan()
    overlays: dict[str, _Overlay] = {}
    for v in incoming:
        rid = v["id"]
        if rid in forgotten:
            continue
        ov = overlays.get(rid)
        if ov is None:
            revs = list(store.revisions(rid))
            ov = overlays[rid] = _Overlay(revs, versions(revs, store.conflicts.get(rid, ()), device), revs[-1].revision if revs else 0)
        stamp = v["v"]
        if stamp in ov.known:
            out.duplicates += 1
            continue
        if not ov.revs:  # a record new here (a deletion too: kept as a tombstone, for later edits to meet)
            _apply(out, ov, v, conflict=False)
            out.applied += 1
            out.changed.add(rid)
            continue
        current = ov.revs[-1]
        now_stamp = current_stamp(ov.revs, device)
        ov.known[stamp] = Version(stamp, tuple(v["p"]), _record(v, 0, current, False))
        tops = heads(ov.known)
        if len(tops) > 1:
            out.conflicts.add(rid)
        else:
            out.conflicts.discard(rid)
        winner = tops[0]
        if winner == stamp:
            del ov.known[stamp]
            _apply(out, ov, v, conflict=False)
            out.applied += 1
            out.changed.add(rid)
            continue
        del ov.known[stamp]
        _apply(out, ov, v, conflict=True)  # a concurrent loser, or an ancestor arriving late: history
        out.kept += 1
        if winner != now_stamp:  # the version that wins now was a conflict revision: it becomes current
            win = ov.known[winner]
            _apply(out, ov, to_wire(win.record, win.stamp, win.parents), conflict=False)
            out.changed.add(rid)
    return out


def _apply(out: Plan, ov: _Overlay, wire: dict[str, Any], *, conflict: bool) -> None:
    """Add one entry to the plan and to the record's overlay."""
    previous = ov.revs[-1] if ov.revs else None
    rev = ov.last_rev if conflict else ov.last_rev + 1
    rec = _record(wire, rev, previous, conflict)
    out.records.append(rec)
    if not conflict:
        ov.last_rev = rev
        ov.revs.append(rec)
    ov.known.setdefault(wire["v"], Version(wire["v"], tuple(wire["p"]), rec))


def open_conflicts(store: VaultStore, device: str, record_id: str) -> list[Record]:
    """The conflict revisions of a record that no later version resolved (heads other than the current)."""
    revs = store.revisions(record_id)
    if not revs:
        return []
    known = versions(revs, store.conflicts.get(record_id, ()), device)
    current = current_stamp(revs, device)
    return [known[s].record for s in heads(known) if s != current]


__all__ = ["BadVersion", "Plan", "WIRE_PUT", "check_wire", "open_conflicts", "plan", "to_wire"]
