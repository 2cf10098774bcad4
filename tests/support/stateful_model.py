"""The model side of :mod:`.stateful`: what the daemon acknowledged (:class:`VaultModel`), the run's
counters, unique tokens, two requests released at once, and the :class:`Steps` a pair step may use.

Apart from :mod:`.stateful` so that :mod:`.stateful_pairs` (the two-at-once steps) and the machine
both import it, and neither imports the other's module back.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hypothesis import strategies as st

from .live import LiveDaemon, Reply

_counter = itertools.count(1)


def token() -> str:
    """A unique word no other record holds (letters only: BM25 indexes it as one term)."""
    n, out = next(_counter), ""
    while n:
        n, r = divmod(n, 26)
        out += chr(ord("a") + r)
    return "zq" + out + random.choice("bcdfghjk") * 2 + "x"


@dataclass
class Rec:
    kind: str  # memory, card, fact
    revision: int
    token: str  # the unique word its current text holds


@dataclass
class VaultModel:
    vid: str
    name: str
    passphrase: str
    unlocked: bool = True
    records: dict[str, Rec] = field(default_factory=dict)
    maybe: set[str] = field(default_factory=set)  # tokens of adds in flight at a SIGKILL: there or not
    gone: set[str] = field(default_factory=set)  # deleted or forgotten
    forgotten_tokens: set[str] = field(default_factory=set)
    folder: Path | None = None
    files: dict[str, str] = field(default_factory=dict)  # file name -> token in it
    ingested: dict[str, tuple[str, str]] = field(default_factory=dict)  # file name -> (card id, token at ingest)
    grants: dict[str, str] = field(default_factory=dict)  # grant id -> token, live
    revoked: dict[str, str] = field(default_factory=dict)

    def of_kind(self, *kinds: str) -> list[str]:
        return sorted(rid for rid, r in self.records.items() if r.kind in kinds)


class Stats:
    """Counters of one run (shared by every example)."""

    def __init__(self) -> None:
        self.examples = 0
        self.steps = 0
        self.requests = 0
        self.answered_error = 0  # expected refusals: vault_locked, bad_passphrase, not_found...
        self.concurrent_pairs = 0
        self.restarts = 0
        self.kills = 0
        self.strong_kdf_ops = 0
        self.locked_reads_checked = 0
        self.records_visible_while_locked = 0
        self.acknowledged_records_lost = 0
        self.crashes = 0
        self.replays_abandoned = 0
        self.failures: list[str] = []


def both(a: Callable[[], Reply | None], b: Callable[[], Reply | None]) -> tuple[Reply | None, Reply | None]:
    """Run two requests at once (each on its own connection, released together)."""
    out: list[Any] = [None, None]
    gate = threading.Barrier(2)

    def go(i: int, fn: Callable[[], Reply | None]) -> None:
        gate.wait()
        try:
            out[i] = fn()
        except (OSError, ConnectionError) as exc:
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out[0], out[1]


class Steps(Protocol):
    """What a pair step uses of the state machine (:class:`.stateful.Machine` is one)."""

    d: LiveDaemon
    stats: Stats
    vaults: list[VaultModel]

    def req(self, method: str, params: dict[str, Any] | None = None, sock: Any = None) -> Reply: ...

    def expect(self, r: Reply, code: str | None, what: str) -> Reply: ...

    def locked_or(self, v: VaultModel, r: Reply, what: str) -> bool: ...

    def pick(self, data: st.DataObject, items: list[Any]) -> Any: ...

    def body(self, data: st.DataObject, tok: str) -> str: ...

    def _gone(self, v: VaultModel, rid: str, *, forgotten: bool) -> None: ...

    def _remembered(self, v: VaultModel, r: Reply, tok: str) -> None: ...
