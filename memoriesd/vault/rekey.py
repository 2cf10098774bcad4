"""A vault's key change (``vault passwd --rekey``): a new random vault key, every file sealed under
the old one written again under it, switched over by one atomic ``header.json`` replace
(docs/format.md, "Key change"). Kept apart from :mod:`.store`, whose state it swaps at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import DiskError
from . import crypto, fsio
from .format import (
    HEAD_NAME,
    HEADER_NAME,
    DirSyncFailed,
    Head,
    Header,
    atomic_write,
    fsync_dir,
    log_name,
    seal_head,
)
from .keys import VaultKeys
from .keywrap import KdfParams, new_header, why
from .recovery import REKEY_PREFIX, discard_rekey, finish_rekey
from .store import VaultStore


@dataclass
class Rekeying:
    """What a key change hands to the code of each sealed derived file: the store (still under its
    old key), the new key, and where to stage a file for it."""

    store: VaultStore
    new_key: bytearray  # stays in vault/: derived files get :attr:`old_keys` and :attr:`new_keys`
    adopted: bool = False  # the key came from another device (sync), not made here

    @property
    def old_keys(self) -> VaultKeys:
        """The sealers and subkeys of the key being replaced (what the files are sealed under now)."""
        return self.store.keys

    @property
    def new_keys(self) -> VaultKeys:
        """The sealers and subkeys of the new key (what the staged files are sealed under)."""
        return VaultKeys(self.new_key)

    def staged(self, name: str) -> Path:
        """Where the new key's ``name`` is written until the switch (``rekey-<name>``)."""
        return self.store.dir / (REKEY_PREFIX + name)


@dataclass(frozen=True)
class RekeyParts:
    """What a key change does beyond the log and the head, given by the layers above the vault.

    ``setting(key, value, rekeying)``: a setting's value as the new log holds it (grants keep the
    key their token hash was made with). ``stage``: each writes the new key's version of some
    derived files with :meth:`Rekeying.staged` names, fsynced, and returns counts for the reply;
    derived files no stage writes are removed once the key changed (their owners rebuild them).
    """

    setting: Callable[[str, Any, Rekeying], Any] | None = None
    stage: Sequence[Callable[[Rekeying], dict[str, int] | None]] = ()


def rekey(
    store: VaultStore, new_passphrase: bytes | bytearray, kdf: KdfParams, parts: RekeyParts | None = None,
    adopt: tuple[bytearray, Header] | None = None,
) -> dict[str, int]:
    """New passphrase AND a new random vault key: every file sealed under the old key is
    written again under the new one, so a copy of the old header opens nothing written since.

    Crash-safe by one switch (docs/format.md, "Key change"): the whole log (every revision, as
    a new epoch), each derived file ``parts.stage`` re-seals, and the head are written and
    fsynced beside the vault as ``rekey-*`` files; then ``header.json`` is replaced atomically
    by one that wraps the new key; only then are the staged files moved into place
    (:func:`~.recovery.finish_rekey`). A crash before the switch leaves the old vault whole
    (unlock removes the staged files); after it, unlock finishes the moves.

    The caller holds the vault closed (no attachment uses the old key) and serialises Argon2id
    runs. Returns the counts the stages report.

    ``adopt`` (a key change made on another device, received through sync): that key and that
    header's wrap and KDF parameters instead of a new key and ``new_passphrase`` (unused then).
    """
    parts = parts or RekeyParts()
    with store.lock:
        store._check_writable()
        _clear_earlier_attempt(store)
        new_key = crypto.new_key()
        if adopt is not None:
            new_key[:] = adopt[0]
        rk = Rekeying(store, new_key, adopted=adopt is not None)
        records = crypto.Sealer(new_key, crypto.LABEL_RECORDS)
        head_sealer = crypto.Sealer(new_key, crypto.LABEL_HEAD)
        switched = False
        try:
            if adopt is None:
                header = new_header(store.header, new_passphrase, new_key, kdf)
            else:
                header = replace(store.header, kdf=dict(adopt[1].kdf), wrap=adopt[1].wrap)
                header.mac = header.compute_mac(new_key)
            epoch = store.head.epoch + 1
            new_head, settings, stats = _stage(rk, parts, epoch, records, head_sealer)
            _switch_header(store, header)
            switched = True
        finally:
            if not switched:
                records.wipe()
                head_sealer.wipe()
                crypto.wipe(new_key)
        store.adopt_key(new_key, records, head_sealer, header, new_head, settings)
        _move_into_place(store, epoch)
        return stats


def _clear_earlier_attempt(store: VaultStore) -> None:
    """Remove the staged files an earlier key change left (unlock removes them too)."""
    try:
        discard_rekey(store.dir, store.vault_id)
    except OSError as exc:
        raise DiskError(
            f"the key of vault {store.name} was not changed: the disk reported an error ({why(exc)}): "
            f"check the disk and try again"
        ) from exc


def _stage(
    rk: Rekeying, parts: RekeyParts, epoch: int, records: crypto.Sealer, head_sealer: crypto.Sealer
) -> tuple[Head, dict[str, Any], dict[str, int]]:
    """Write the new key's log (every revision, as ``epoch``), each derived file ``parts.stage``
    re-seals and, last, the head, all as fsynced ``rekey-*`` files: the new head, the settings as
    the new log holds them and the stages' counts. On failure nothing staged is left and the
    vault is as it was."""
    store = rk.store
    stats: dict[str, int] = {}
    setting = parts.setting
    try:
        entries, _, settings, _ = store._log_entries(None, None if setting is None else (lambda k, v: setting(k, v, rk)))
        new_head = store._write_log(rk.staged(log_name(epoch)), epoch, entries, records)
        for stage in parts.stage:
            stats.update(stage(rk) or {})
        # Staged last: a staged head exists only once everything it needs is durable.
        atomic_write(rk.staged(HEAD_NAME), seal_head(head_sealer, store.vault_id, new_head))
    except BaseException as exc:
        _unstage(store)
        if isinstance(exc, OSError):
            raise DiskError(
                f"the key of vault {store.name} was not changed: the disk reported an error ({why(exc)}); "
                f"nothing changed: check the disk (a key change needs room for a second copy of the "
                f"vault) and try again"
            ) from exc
        raise
    return new_head, settings, stats


def _switch_header(store: VaultStore, header: Header) -> None:
    """The switch: ``header.json`` wraps the new key from now on (one atomic replace)."""
    try:
        atomic_write(store.dir / HEADER_NAME, header.to_bytes())
    except DirSyncFailed as exc:
        # header.json wraps the new key now, but the rename may not survive a power loss:
        # nothing is moved, so whichever header comes back finds its own files at unlock.
        store.refuse_writes(why(exc))
        raise DiskError(
            f"vault {store.name}: the new key was written but the disk reported an error ({why(exc)}), "
            f"so after a crash the old passphrase may be the one that opens it: check the disk, then "
            f"unlock the vault (try the new passphrase, then the old one)"
        ) from exc
    except OSError as exc:
        _unstage(store)
        raise DiskError(
            f"the key of vault {store.name} was not changed: the disk reported an error ({why(exc)}); "
            f"nothing changed: check the disk and try again"
        ) from exc


def _move_into_place(store: VaultStore, epoch: int) -> None:
    """After the switch: the staged files take their names and the old key's log goes."""
    try:
        finish_rekey(store.dir, store.vault_id, epoch)
        fsio.unlink(store.dir / log_name(epoch - 1), missing_ok=True)  # sealed under the old key
        fsync_dir(store.dir)
    except OSError as exc:
        store.refuse_writes(why(exc))
        raise DiskError(
            f"vault {store.name}: the key was changed, but the disk reported an error ({why(exc)}) while "
            f"putting the new files in place: check the disk, then unlock the vault with the new "
            f"passphrase (unlock finishes it)"
        ) from exc


def _unstage(store: VaultStore) -> None:
    """Remove what a key change staged before it switched (best effort: no header wraps their
    key, so the next unlock removes whatever is left)."""
    try:
        discard_rekey(store.dir, store.vault_id)
    except OSError:
        pass


__all__ = ["Rekeying", "RekeyParts", "rekey"]
