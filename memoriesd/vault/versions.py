"""Versions of a record for sync: stamps, parents and heads (the DAG that :mod:`memoriesd.sync.merge` merges).

Every revision a synced vault writes carries a *stamp* (``"<hlc>-<device>"``: 16 hex digits of a
hybrid logical clock, then the device id; stamps compare as strings) and the stamps it was made
from (*parents*). Revisions written before the vault first synced have no stamp: they get a
*derived* one from their time, their local revision number and this device's id, the same every
time, so the device that wrote them can publish them. A record's *heads* are its versions that no
other version names as a parent: one head is the usual state; more are concurrent edits (one is
current, the others are conflict revisions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from .records import Record

#: A setting per forgotten record of a synced vault (its value: the forget's stamp). Sync refuses
#: every version of the record from then on; compaction keeps no tombstone of it.
FORGOT_PREFIX = "sync.forgot."


class Stamper(Protocol):
    """The clock that stamps a synced vault's new revisions (:class:`memoriesd.sync.stamps.Clock`)."""

    @property
    def device(self) -> str: ...

    @property
    def published_upto(self) -> str:
        """This device's versions up to this stamp are on every target (others may hold them)."""
        ...

    @property
    def origin(self) -> str:
        """The device id that derives the stamps of revisions written before the vault synced."""
        ...

    def next(self) -> str: ...


def derived_stamp(rec: Record, device: str) -> str:
    """The stamp of a revision written before its vault synced: its time (ms) and local revision."""
    return f"{(int(rec.updated * 1000) << 16) | (rec.revision & 0xFFFF):016x}-{device}"


@dataclass(frozen=True)
class Version:
    """One version of a record: its stamp, the stamps it was made from, and the revision holding it."""

    stamp: str
    parents: tuple[str, ...]
    record: Record


def versions(revs: Sequence[Record], conflicts: Iterable[Record], device: str) -> dict[str, Version]:
    """Every version of a record by stamp: its revisions (oldest first) and its conflict revisions."""
    out: dict[str, Version] = {}
    prev = ""
    for rec in revs:
        if rec.version:
            stamp, parents = rec.version, rec.parents
        else:
            stamp, parents = derived_stamp(rec, device), ((prev,) if prev else ())
        out.setdefault(stamp, Version(stamp, parents, rec))
        prev = stamp
    for rec in conflicts:
        if rec.version:
            out.setdefault(rec.version, Version(rec.version, rec.parents, rec))
    return out


def heads(known: dict[str, Version]) -> list[str]:
    """The stamps no other known version names as a parent, highest first (the first one wins)."""
    named: set[str] = set()
    for v in known.values():
        named.update(v.parents)
    return sorted((s for s in known if s not in named), reverse=True)


def current_stamp(revs: Sequence[Record], device: str) -> str:
    """The stamp of a record's current revision (derived when it has none)."""
    last = revs[-1]
    return last.version or derived_stamp(last, device)


def stamp_device(stamp: str) -> str:
    """The device part of a stamp."""
    return stamp.partition("-")[2]


def dropped_heads(revs: Sequence[Record], kept: Sequence[Record], conflicts: Sequence[Record], device: str) -> list[Record]:
    """Heads of a synced record (concurrent versions no edit resolved) that a compaction keeping only
    ``kept`` would drop with the older revisions: kept as conflict revisions instead, so every device
    keeps the same heads."""
    known = versions(revs, conflicts, device)
    have = {r.version for r in kept} | {r.version for r in conflicts}
    return [replace(known[s].record, conflict=True) for s in heads(known) if s not in have and known[s].record.version]


def resolved_kept(revs: Sequence[Record], kept: Sequence[Record], conflicts: Sequence[Record], device: str) -> list[Record]:
    """The conflict revisions a compaction that keeps only ``kept`` of ``revs`` keeps: the heads, and
    those a kept version names. A conflict revision a later version resolved, named only by revisions
    the compaction drops, would become a head again (a conflict this device alone shows): it goes too."""
    tops = set(heads(versions(revs, conflicts, device)))
    keep = {c.version for c in conflicts if c.version in tops}
    named = {p for r in kept for p in r.parents}
    while True:
        named |= {p for c in conflicts if c.version in keep for p in c.parents}
        more = {c.version for c in conflicts if c.version in named} - keep
        if not more:
            return [c for c in conflicts if c.version in keep]
        keep |= more


def spliced(
    revs: Sequence[Record], conflicts: Iterable[Record], live: list[Record], extra: list[Record], origin: str,
    own: set[str], published: str,
) -> tuple[list[Record], list[Record]]:
    """Kept versions whose parents a compaction drops name those parents' parents instead, through
    this device's own dropped versions that no target has yet (``published``: the highest own stamp
    every target has; another device's versions, and this device's published ones, others may hold):
    every device then sees the same ancestry, and the same heads."""
    full = versions(revs, conflicts, origin)
    kept = {r.version for r in live} | {r.version for r in extra}

    def splice(parents: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        todo, seen = list(parents), set()
        while todo:
            p = todo.pop(0)
            if p in seen:
                continue
            seen.add(p)
            if p in kept or p not in full or stamp_device(p) not in own or p <= published:
                out.append(p)  # a version other devices may hold: published by this device or another
            else:
                todo.extend(full[p].parents)
        return tuple(out)

    def fix(recs: list[Record]) -> list[Record]:
        return [replace(r, parents=splice(r.parents)) if r.version and r.parents else r for r in recs]

    return fix(live), fix(extra)


__all__ = ["FORGOT_PREFIX", "Stamper", "dropped_heads", "resolved_kept", "spliced", "Version", "current_stamp", "derived_stamp", "heads", "stamp_device", "versions"]
