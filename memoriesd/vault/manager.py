"""All vaults of a home: which exist, which are unlocked, idle tracking, unlock slow-down, keyring.

Unlocked state lives only here, in daemon memory. Locking calls every registered lock listener
(index caches, in-flight operations) so nothing derived survives the key.
"""

from __future__ import annotations

import base64
import logging
import shutil
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import (
    BadPassphrase,
    KeyringUnavailable,
    MemoriesError,
    UsageError,
    VaultAmbiguous,
    VaultExists,
    VaultLocked,
    VaultNotFound,
)
from ..home import Home
from . import crypto
from .format import HEADER_NAME
from .records import new_record_id
from .store import KdfParams, VaultStore, public_header

log = logging.getLogger("memoriesd.vault")
KEYRING_SERVICE = "memories-vault"


@dataclass
class _Unlocked:
    store: VaultStore
    last_used: float


def validate_name(name: str) -> str:
    name = unicodedata.normalize("NFC", name.strip())
    if not 1 <= len(name) <= 64 or any(unicodedata.category(c).startswith("C") for c in name) or "/" in name:
        raise UsageError("a vault name must be 1 to 64 printable characters without '/': choose another name")
    return name


class VaultManager:
    def __init__(self, home: Home, config: Config) -> None:
        self.home = home
        self.config = config
        self._lock = threading.RLock()
        self._unlocked: dict[str, _Unlocked] = {}
        self._failures: dict[str, int] = {}
        self._listeners: list[Callable[[str], None]] = []

    # ------------------------------------------------------------------ discovery

    def kdf(self) -> KdfParams:
        v = self.config.vault
        return KdfParams(v.kdf_memory_kib, v.kdf_iterations, v.kdf_lanes)

    def list_vaults(self) -> list[dict[str, Any]]:
        out = []
        if self.home.vaults.exists():
            for d in sorted(self.home.vaults.iterdir()):
                if not d.is_dir():
                    continue
                info = public_header(d)
                if info is None:
                    if not (d / HEADER_NAME).exists():
                        continue  # not a vault (or a creation that never wrote its header)
                    # A damaged header: still listed, so that unlock says vault_corrupt, not "no vault".
                    info = {"vault_id": d.name, "name": d.name, "corrupt": True}
                info["locked"] = self.unlocked_store(info["vault_id"]) is None
                out.append(info)
        return sorted(out, key=lambda v: (v["name"].casefold(), v["vault_id"]))

    def resolve(self, ref: str) -> str:
        """Vault id for an id or a unique name."""
        if not isinstance(ref, str) or not ref:
            raise UsageError("name a vault by its id or its name: see `memories vault list`")
        vaults = self.list_vaults()
        for v in vaults:
            if v["vault_id"] == ref:
                return ref
        named = [v for v in vaults if v["name"] == ref] or [v for v in vaults if v["name"].casefold() == ref.casefold()]
        if len(named) == 1:
            return str(named[0]["vault_id"])
        if len(named) > 1:
            raise VaultAmbiguous(f"more than one vault is named {ref}: use its id (see `memories vault list`)")
        raise VaultNotFound(f"no vault {ref}: see `memories vault list`, or create it with `memories vault create`")

    def name_of(self, vault_id: str) -> str:
        info = public_header(self.home.vaults / vault_id)
        return info["name"] if info else vault_id

    # ------------------------------------------------------------------ lifecycle

    def create(self, name: str, passphrase: bytearray) -> VaultStore:
        name = validate_name(name)
        if not passphrase:
            raise UsageError("the passphrase is empty: choose a passphrase")
        with self._lock:
            if any(v["name"].casefold() == name.casefold() for v in self.list_vaults()):
                raise VaultExists(f"a vault named {name} already exists: choose another name")
            vault_id = new_record_id()[:12]
            store = VaultStore.create(self.home.vaults / vault_id, vault_id, name, passphrase, self.kdf())
            self._unlocked[vault_id] = _Unlocked(store, time.monotonic())
            log.info("vault %s created", vault_id)
            return store

    def unlock(self, ref: str, passphrase: bytearray | None) -> VaultStore:
        vault_id = self.resolve(ref)
        with self._lock:
            current = self._unlocked.get(vault_id)
            if current is not None:
                current.last_used = time.monotonic()
                return current.store
        vault_dir = self.home.vaults / vault_id
        if passphrase is None:
            key = self._keyring_get(vault_id)
            if key is None:
                raise BadPassphrase(
                    f"vault {self.name_of(vault_id)} needs its passphrase (none is remembered): "
                    "pass --passphrase-stdin or --passphrase-file, or run the command in a terminal",
                    code="passphrase_required",
                )
            store = VaultStore.open(vault_dir, key=key)
        else:
            failures = self._failures.get(vault_id, 0)
            if failures:
                v = self.config.vault
                time.sleep(min(v.unlock_delay_step_ms * failures, v.unlock_delay_max_ms) / 1000.0)
            try:
                store = VaultStore.open(vault_dir, passphrase=passphrase)
            except BadPassphrase:
                self._failures[vault_id] = failures + 1
                log.info("vault %s: wrong passphrase (failure %d)", vault_id, failures + 1)
                raise
            self._failures.pop(vault_id, None)
        with self._lock:
            existing = self._unlocked.get(vault_id)
            if existing is not None:  # another unlock won the race
                store.close()
                return existing.store
            self._unlocked[vault_id] = _Unlocked(store, time.monotonic())
        log.info("vault %s unlocked", vault_id)
        return store

    def lock(self, vault_id: str, reason: str = "lock") -> bool:
        with self._lock:
            entry = self._unlocked.pop(vault_id, None)
        if entry is None:
            return False
        for listener in list(self._listeners):
            try:
                listener(vault_id)
            except Exception:  # a listener must never keep a key alive
                log.exception("lock listener failed")
        entry.store.close()
        log.info("vault %s locked (%s)", vault_id, reason)
        return True

    def lock_all(self, reason: str = "lock") -> list[str]:
        with self._lock:
            ids = list(self._unlocked)
        return [v for v in ids if self.lock(v, reason)]

    def on_lock(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def unlocked_store(self, vault_id: str) -> VaultStore | None:
        with self._lock:
            entry = self._unlocked.get(vault_id)
            return entry.store if entry else None

    def store(self, ref: str) -> VaultStore:
        """The unlocked store for ``ref`` (touching its idle timer) or ``vault_locked``."""
        vault_id = self.resolve(ref)
        with self._lock:
            entry = self._unlocked.get(vault_id)
            if entry is None:
                name = self.name_of(vault_id)
                raise VaultLocked(f"vault {name} is locked: run `memories vault unlock {name}`")
            entry.last_used = time.monotonic()
            return entry.store

    def expire_idle(self) -> list[str]:
        minutes = self.config.daemon.auto_lock_minutes
        if minutes <= 0:
            return []
        limit = minutes * 60.0
        now = time.monotonic()
        with self._lock:
            idle = [vid for vid, e in self._unlocked.items() if now - e.last_used >= limit]
        return [v for v in idle if self.lock(v, "auto-lock")]

    def delete(self, ref: str) -> str:
        vault_id = self.resolve(ref)
        self.lock(vault_id, "delete")
        self._keyring_delete(vault_id)
        shutil.rmtree(self.home.vaults / vault_id)
        log.info("vault %s deleted", vault_id)
        return vault_id

    def passwd(self, ref: str, old: bytearray, new: bytearray) -> None:
        vault_id = self.resolve(ref)
        if not new:
            raise UsageError("the new passphrase is empty: choose a passphrase")
        # Verify the old passphrase against the header even when the vault is unlocked.
        probe = VaultStore.open(self.home.vaults / vault_id, passphrase=old)
        try:
            store = self.unlocked_store(vault_id) or probe
            store.rewrap(new, self.kdf())
        finally:
            if probe is not self.unlocked_store(vault_id):
                probe.close()
        log.info("vault %s passphrase changed", vault_id)

    # ------------------------------------------------------------------ keyring

    def remember(self, store: VaultStore) -> None:
        """Keep the vault key in the OS keyring so unlock needs no passphrase."""
        try:
            import keyring
            import keyring.errors

            keyring.set_password(KEYRING_SERVICE, store.vault_id, base64.b64encode(bytes(store.key)).decode("ascii"))
        except Exception as exc:
            # keyring.errors.NoKeyringError is the normal state on headless machines.
            raise KeyringUnavailable(
                "no OS keyring is available here, so the passphrase is not remembered: the vault works with "
                "its passphrase"
            ) from exc

    def _keyring_get(self, vault_id: str) -> bytearray | None:
        try:
            import keyring

            value = keyring.get_password(KEYRING_SERVICE, vault_id)
        except Exception:
            return None
        if not value:
            return None
        try:
            key = bytearray(base64.b64decode(value))
        except ValueError:
            return None
        return key if len(key) == crypto.KEY_BYTES else None

    def _keyring_delete(self, vault_id: str) -> None:
        try:
            import keyring

            keyring.delete_password(KEYRING_SERVICE, vault_id)
        except Exception:
            pass

    def forget(self, vault_id: str) -> None:
        self._keyring_delete(vault_id)


def vault_dir_for(home: Home, vault_id: str) -> Path:
    return home.vaults / vault_id


__all__ = ["VaultManager", "MemoriesError"]
