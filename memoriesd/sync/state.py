"""This device's sync state for one vault: ``sync-state.bin``, sealed, in the vault's directory.

It holds the device id, the vault's targets (what the user typed: a folder path or
``rclone:REMOTE:PATH``) and, per target, how far this device got: its own chain (last segment
number and hash, the highest stamp published), what it applied of every other device, the files it
has opened, the epoch, and what went wrong. It is sealed under the vault's ``memories/v1/sync-state``
subkey (``MAGIC || sealed(JSON)``, AAD ``memories/sync-state/v1|<vault id>``) and replaced
atomically. It is never sent anywhere. Losing it loses no record: the targets must be added again,
and the next pull reads every file of the target once more.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..vault import crypto
from ..vault.format import atomic_write
from ..vault.keys import VaultKeys
from ..vault.rekey import Rekeying
from .stamps import new_device_id

log = logging.getLogger("memoriesd.sync")

STATE_NAME = "sync-state.bin"
MAGIC = b"MEMSS1\n"


@dataclass
class Peer:
    """What this device knows of another device on one target."""

    seq: int = 0  # the last of its segments applied here (this epoch's chain)
    hash: str = ""  # that segment's digest ("" before its first segment of the epoch)
    seen: float = 0.0  # the time its tip said it was last active
    tip_seq: int = 0  # the highest segment number any of its tips or segments showed
    label: str = ""  # the name it gives itself (its host name; sealed on the target)
    acks: dict[str, int] = field(default_factory=dict)  # what it has applied of each device (its tip)


@dataclass
class TargetState:
    """This device's progress on one target."""

    target: str
    added: float
    epoch: int = 0
    seq: int = 0  # this device's last segment on the target (numbers never restart)
    hash: str = ""  # its digest ("" before the first segment of this epoch)
    upto: str = ""  # the highest stamp of this device's own versions published
    own: list[list[Any]] = field(default_factory=list)  # [seq, upto] per own segment this epoch
    peers: dict[str, Peer] = field(default_factory=dict)
    files: dict[str, list[Any]] = field(default_factory=dict)  # name -> [kind, device, epoch, seq, digest] of opened files
    wrap_time: float = 0.0  # the passphrase change (its time) whose header this device has
    header_wrap: str = ""  # this device's wrapped key as last synced with the target: another one here is a local passwd
    former: dict[str, list[str]] = field(default_factory=dict)  # id before a fork -> [published upto, highest stamp]: to publish again
    forget_seq: int = 0  # the own segment holding the latest forget not yet compacted away
    rekey: bool = False  # the vault key changed here: the target is to be written again under it
    last_push: float = 0.0
    last_pull: float = 0.0
    pushed: int = 0  # versions published in all
    received: int = 0  # versions received in all
    error: str = ""  # the last cycle's one-line error ("" when it went through)
    problems: dict[str, str] = field(default_factory=dict)  # what the target holds that was refused, by kind

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> TargetState:
        fields = set(Peer.__dataclass_fields__)
        peers = {k: Peer(**{f: x for f, x in v.items() if f in fields}) for k, v in doc.pop("peers", {}).items()}
        known = {f.name for f in TargetState.__dataclass_fields__.values()}
        return TargetState(**{k: v for k, v in doc.items() if k in known}, peers=peers)


@dataclass
class SyncState:
    """Everything in ``sync-state.bin``."""

    device: str = field(default_factory=new_device_id)
    label: str = ""
    origin: str = ""  # the first device id, kept by a fork: it derives stamps of revisions older than sync
    targets: dict[str, TargetState] = field(default_factory=dict)  # by target id (short, local)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode("utf-8")

    @staticmethod
    def from_bytes(data: bytes) -> SyncState:
        doc = json.loads(data.decode("utf-8"))
        targets = {k: TargetState.from_dict(dict(v)) for k, v in doc.get("targets", {}).items()}
        return SyncState(device=str(doc["device"]), label=str(doc.get("label", "")), origin=str(doc.get("origin", "")), targets=targets)


class StateFile:
    """Reads and writes one vault's ``sync-state.bin`` (the caller serialises writes)."""

    def __init__(self, vault_dir: Path, vault_id: str, keys: VaultKeys) -> None:
        self.path = vault_dir / STATE_NAME
        self._aad = b"memories/sync-state/v1|" + vault_id.encode("ascii")
        self._sealer = keys.sealer(crypto.LABEL_SYNC_STATE)

    def load(self) -> SyncState | None:
        """The state, or None when the vault never synced; a damaged file is logged and read as none."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            if not data.startswith(MAGIC):
                raise ValueError("magic")
            return SyncState.from_bytes(self._sealer.open(data[len(MAGIC) :], self._aad))
        except (crypto.CryptoFailure, ValueError, KeyError, TypeError) as exc:
            log.warning("sync state of this vault does not open (%s): its targets must be added again", type(exc).__name__)
            return None

    def save(self, state: SyncState) -> None:
        atomic_write(self.path, MAGIC + self._sealer.seal(state.to_bytes(), self._aad))

    def wipe(self) -> None:
        self._sealer.wipe()


def rekey_sync_state(rk: Rekeying) -> dict[str, int]:
    """A key change's stage for ``sync-state.bin``: sealed again under the new key. A key made here
    marks every target to be written again under it (the next cycle does: a new epoch, the header,
    the old files removed); a key taken from another device (``rk.adopted``) marks nothing."""
    store = rk.store
    old = StateFile(store.dir, store.vault_id, rk.old_keys)
    new = StateFile(store.dir, store.vault_id, rk.new_keys)
    new.path = rk.staged(STATE_NAME)
    try:
        state = old.load()
        if state is None:
            return {}
        for ts in state.targets.values():
            ts.rekey = not rk.adopted
            ts.files = {}  # names under the old key: the new key names every file anew
            ts.problems.pop("header", None)
            ts.header_wrap = ""  # the key's wrap changed with it: the target's header (or ours, forced) is the one
        new.save(state)
        return {"sync_targets": len(state.targets)}
    finally:
        old.wipe()
        new.wipe()


__all__ = ["MAGIC", "Peer", "STATE_NAME", "StateFile", "SyncState", "TargetState", "rekey_sync_state"]
