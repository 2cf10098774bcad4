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
from dataclasses import dataclass
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


__all__ = ["FORGOT_PREFIX", "Stamper", "Version", "current_stamp", "derived_stamp", "heads", "stamp_device", "versions"]
