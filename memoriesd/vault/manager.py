"""All vaults of a home: which exist, which are unlocked, idle tracking, unlock slow-down, keyring.

Unlocked state lives only here, in daemon memory, one :class:`~memoriesd.vault.live.LiveVault` per
unlocked vault. Operations take a lease on it (:meth:`VaultManager.use`); lock, auto-lock, delete
and shutdown close it in one order (see :mod:`memoriesd.vault.live`), so nothing derived survives
the key.

Per vault, one *gate* (an exclusive lock) serialises what opens, closes or re-keys it: unlock
(which runs crash recovery while nothing else has the vault open), lock, passwd, rekey and delete. A
wrong passphrase slows the next attempt on that vault; the attempts queue behind the gate, so
parallel guesses wait one after another, and the count survives a daemon restart.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..config import Config
from ..errors import (
    BadPassphrase,
    KeyringUnavailable,
    MemoriesError,
    UsageError,
    VaultAmbiguous,
    VaultCorrupt,
    VaultExists,
    VaultLocked,
    VaultNotFound,
)
from ..home import Home
from . import crypto, fsio
from .format import HEADER_NAME, Header, atomic_write, read_header
from .headers import HeaderCache
from .keys import VaultKeys
from .keywrap import KdfParams, unwrap_key
from .live import LeaseScope, LiveVault, locked_error
from .records import new_record_id
from .rekey import RekeyParts, rekey
from .remembered import KEYRING_SERVICE, KeyringUnreadable, forget_key, remember_key, remembered_key  # noqa: F401 - KEYRING_SERVICE: its old home
from .store import VaultStore

log = logging.getLogger("memoriesd.vault")
FAILURES_NAME = "unlock-failures"  # wrong-passphrase count (a plain integer: not secret)
T = TypeVar("T")


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
        self._unlocked: dict[str, LiveVault] = {}
        self._gates: dict[str, threading.Lock] = {}
        self._create_lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []
        self._unlock_listeners: list[Callable[[str], None]] = []
        self.drain_seconds = 60.0  # how long a lock waits for in-flight operations
        self._headers = HeaderCache()  # names and ids, parsed again only when a header.json changes

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
                info = self._headers.public(d)
                if info is None or info["vault_id"] != d.name:
                    # A header naming another vault (edited, or copied from another vault's directory) is
                    # damaged: listed under its directory so that unlock says vault_corrupt.
                    if not (d / HEADER_NAME).exists():
                        continue  # not a vault (or a creation that never wrote its header)
                    # A damaged header: still listed, so that unlock says vault_corrupt, not "no vault".
                    info = {"vault_id": d.name, "name": d.name, "corrupt": True}
                info["locked"] = self.live(info["vault_id"]) is None
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
        info = self._headers.public(self.home.vaults / vault_id)
        return info["name"] if info else vault_id

    # ------------------------------------------------------------------ live vaults and leases

    def live(self, vault_id: str) -> LiveVault | None:
        """The open owner of an unlocked vault (None when locked or closing)."""
        with self._lock:
            entry = self._unlocked.get(vault_id)
        return entry if entry is not None and entry.is_open else None

    def use(self, ref: str, ctx: LeaseScope) -> LiveVault:
        """The unlocked vault ``ref`` under a lease held until the request ``ctx`` ends: its store,
        its purpose keys, its named locks and its attachments (see :mod:`.live`).

        While the lease is held the vault cannot finish closing; once it starts closing,
        ``ctx.check_cancelled()`` raises ``cancelled`` so long operations stop between steps.
        """
        vault_id = self.resolve(ref)
        entry = self.live(vault_id)
        if entry is None:
            raise locked_error(self.name_of(vault_id))
        entry.acquire()
        ctx.leases.append(entry.release)
        ctx.checks.append(entry.check)
        return entry

    def try_use(self, vault_id: str, ctx: LeaseScope) -> LiveVault | None:
        """Like :meth:`use` for a vault id, or None when it is locked."""
        entry = self.live(vault_id)
        if entry is None:
            return None
        try:
            entry.acquire()
        except VaultLocked:
            return None
        ctx.leases.append(entry.release)
        ctx.checks.append(entry.check)
        return entry

    def unlocked_store(self, vault_id: str) -> VaultStore | None:
        """The store of an unlocked vault, without a lease: for a glance (status), not for work."""
        entry = self.live(vault_id)
        return entry.store if entry is not None else None

    def store(self, ref: str) -> VaultStore:
        """The unlocked store for ``ref`` without a lease (outside requests: tests, tools)."""
        vault_id = self.resolve(ref)
        entry = self.live(vault_id)
        if entry is None:
            raise locked_error(self.name_of(vault_id))
        entry.last_used = time.monotonic()
        return entry.store

    @contextlib.contextmanager
    def _gate(self, vault_id: str) -> Iterator[None]:
        with self._lock:
            gate = self._gates.setdefault(vault_id, threading.Lock())
        with gate:
            yield

    def _register(self, store: VaultStore) -> LiveVault:
        entry = LiveVault(store)
        for listener in list(self._listeners):
            entry.on_close(lambda lv, fn=listener: fn(lv.vault_id))  # type: ignore[misc]
        with self._lock:
            self._unlocked[store.vault_id] = entry
        return entry

    # ------------------------------------------------------------------ lifecycle

    def create(self, name: str, passphrase: bytearray) -> VaultStore:
        name = validate_name(name)
        if not passphrase:
            raise UsageError("the passphrase is empty: choose a passphrase")
        with self._create_lock:  # not self._lock: the KDF below must not stall every other request
            if any(v["name"].casefold() == name.casefold() for v in self.list_vaults()):
                raise VaultExists(f"a vault named {name} already exists: choose another name")
            vault_id = new_record_id()[:12]
            store = VaultStore.create(self.home.vaults / vault_id, vault_id, name, passphrase, self.kdf())
            self._register(store)
            log.info("vault %s created", vault_id)
            return store

    def join(self, shared: Header, passphrase: bytearray, name_of: Callable[[VaultKeys], str]) -> VaultStore:
        """A vault made here from a sync target's header (:meth:`VaultStore.join`), left unlocked."""
        if not passphrase:
            raise UsageError("the passphrase is empty: type the vault's passphrase")
        with self._create_lock:
            if (self.home.vaults / shared.vault_id).exists():
                raise VaultExists("this device already has that vault: unlock it and add the target with `memories sync add`")
            store = VaultStore.join(self.home.vaults / shared.vault_id, shared, passphrase, name_of)
            self._register(store)
            log.info("vault %s joined from a sync target", shared.vault_id)
            return store

    def unlock(self, ref: str, passphrase: bytearray | None) -> VaultStore:
        vault_id = self.resolve(ref)
        vault_dir = self.home.vaults / vault_id
        with self._gate(vault_id):
            current = self.live(vault_id)
            if current is not None:
                if passphrase is not None:
                    # Already unlocked: a wrong passphrase is still wrong (and still slows the next try).
                    self._check_passphrase(vault_id, current, passphrase)
                current.last_used = time.monotonic()
                return current.store
            if passphrase is None:
                key = self._keyring_get(vault_id)
                if key is None:
                    raise BadPassphrase(
                        f"vault {self.name_of(vault_id)} needs its passphrase (none is remembered): "
                        "pass --passphrase-stdin or --passphrase-file, or run the command in a terminal",
                        code="passphrase_required",
                    )
                store = VaultStore.open(vault_dir, key=key)  # crash recovery runs here, under the gate
            else:
                store = self._slowed(vault_id, lambda: VaultStore.open(vault_dir, passphrase=passphrase))
            self._register(store)
        log.info("vault %s unlocked", vault_id)
        self._notify_unlocked(vault_id)
        return store

    def _notify_unlocked(self, vault_id: str) -> None:
        for listener in list(self._unlock_listeners):
            try:
                listener(vault_id)
            except Exception:  # an unlock never fails for a listener
                log.exception("unlock listener failed")

    def on_unlock(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(vault_id)`` after a vault was unlocked (e.g. to resume background indexing)."""
        self._unlock_listeners.append(listener)

    def _check_passphrase(self, vault_id: str, entry: LiveVault, passphrase: bytearray) -> None:
        header = read_header(self.home.vaults / vault_id, entry.name)
        key = self._slowed(vault_id, lambda: unwrap_key(header, passphrase))
        try:
            if not crypto.mac_equal(bytes(key), bytes(entry.store.key)):
                raise BadPassphrase(f"wrong passphrase for vault {entry.name}: try again")
        finally:
            crypto.wipe(key)

    # -------------------------------------------------------------- wrong-passphrase slow-down

    def _failures(self, vault_id: str) -> int:
        try:
            return max(0, min(int((self.home.vaults / vault_id / FAILURES_NAME).read_text("ascii").strip()), 1_000_000))
        except (OSError, ValueError):
            return 0

    def _set_failures(self, vault_id: str, n: int) -> None:
        path = self.home.vaults / vault_id / FAILURES_NAME
        try:
            if n:
                atomic_write(path, f"{n}\n".encode("ascii"))
            else:
                fsio.unlink(path, missing_ok=True)
        except OSError as exc:
            log.warning("vault %s: cannot record the failed-unlock count (%s)", vault_id, exc.strerror)

    def _slowed(self, vault_id: str, attempt: Callable[[], T]) -> T:
        """Run a passphrase check after the delay earned by earlier failures. Callers hold the
        vault's gate, so parallel attempts wait one after another."""
        failures = self._failures(vault_id)
        if failures:
            v = self.config.vault
            time.sleep(min(v.unlock_delay_step_ms * failures, v.unlock_delay_max_ms) / 1000.0)
        try:
            result = attempt()
        except BadPassphrase:
            self._set_failures(vault_id, failures + 1)
            log.info("vault %s: wrong passphrase (failure %d)", vault_id, failures + 1)
            raise
        if failures:
            self._set_failures(vault_id, 0)
        return result

    # ------------------------------------------------------------------ closing

    def lock(self, vault_id: str, reason: str = "lock") -> bool:
        """Close an unlocked vault: no new work, in-flight work cancelled or finished, then wipe.

        Returns once every key of the vault is wiped; False when it was not unlocked.
        """
        with self._gate(vault_id):
            return self._close(vault_id, reason)

    def _close(self, vault_id: str, reason: str) -> bool:
        with self._lock:
            entry = self._unlocked.get(vault_id)
            if entry is None or not entry.begin_close():
                return False
        try:
            entry.finish_close(self.drain_seconds)
        finally:
            with self._lock:
                if self._unlocked.get(vault_id) is entry:
                    del self._unlocked[vault_id]
        log.info("vault %s locked (%s)", vault_id, reason)
        return True

    def lock_all(self, reason: str = "lock") -> list[str]:
        with self._lock:
            ids = list(self._unlocked)
        return [v for v in ids if self.lock(v, reason)]

    def on_lock(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(vault_id)`` when a vault closes: after its in-flight work, before its keys are wiped."""
        self._listeners.append(listener)
        with self._lock:
            entries = list(self._unlocked.values())
        for entry in entries:
            entry.on_close(lambda lv, fn=listener: fn(lv.vault_id))  # type: ignore[misc]

    def expire_idle(self) -> list[str]:
        minutes = self.config.daemon.auto_lock_minutes
        if minutes <= 0:
            return []
        limit = minutes * 60.0
        now = time.monotonic()
        with self._lock:
            idle = [vid for vid, e in self._unlocked.items() if e.is_open and not e.leases and now - e.last_used >= limit]
        return [v for v in idle if self.lock(v, "auto-lock")]

    def delete(self, ref: str, notices: list[str] | None = None) -> str:
        """Delete a vault's files and its remembered key; when the key may still be in the OS
        keyring (its delete failed), the notice saying so is appended to ``notices``."""
        vault_id = self.resolve(ref)
        with self._gate(vault_id):
            self._close(vault_id, "delete")
            left = self._keyring_delete(vault_id)
            shutil.rmtree(self.home.vaults / vault_id)
        log.info("vault %s deleted", vault_id)
        if left is not None and notices is not None:
            notices.append(left)
        return vault_id

    @contextlib.contextmanager
    def _old_key(self, ref: str, old: bytearray, new: bytearray) -> Iterator[tuple[str, Header, bytearray]]:
        """For a passphrase or key change: under the vault's gate, ``(vault id, header, key)`` with
        the key ``old`` unwraps (slowed like unlock after wrong guesses); the key is wiped after."""
        vault_id = self.resolve(ref)
        if not new:
            raise UsageError("the new passphrase is empty: choose a passphrase")
        with self._gate(vault_id):
            header = read_header(self.home.vaults / vault_id, self.name_of(vault_id))
            key = self._slowed(vault_id, lambda: unwrap_key(header, old))
            try:
                yield vault_id, header, key
            finally:
                crypto.wipe(key)

    @staticmethod
    def _check_header(header: Header, key: bytearray) -> None:
        if not header.verify_mac(key):
            raise VaultCorrupt(f"vault {header.name} is damaged (its header was altered): restore the vault directory from a backup")

    def passwd(self, ref: str, old: bytearray, new: bytearray) -> None:
        """New passphrase. Never opens a second store on the vault: the header is re-wrapped with
        the key of the live store, or (locked) with the key the old passphrase unwraps."""
        with self._old_key(ref, old, new) as (vault_id, header, key):
            entry = self.live(vault_id)
            if entry is not None:
                with entry.use() as store:
                    store.rewrap(new, self.kdf())
            else:
                self._check_header(header, key)
                # A store object that only re-wraps: it reads no log and recovers nothing.
                offline = VaultStore(self.home.vaults / vault_id, header, bytearray(key))
                try:
                    offline.rewrap(new, self.kdf())
                finally:
                    offline.close()
        log.info("vault %s passphrase changed", vault_id)

    def adopt_key(self, ref: str, shared: Header, passphrase: bytearray, parts: RekeyParts | None = None) -> dict[str, Any]:
        """A key change made on another device (sync): the key ``shared`` (a target's header) wraps
        under ``passphrase`` (the new one) replaces this vault's, which must be unlocked; every file
        is sealed again under it, as a key change here does (:func:`.rekey.rekey` with ``adopt``)."""
        vault_id = self.resolve(ref)
        entry = self.live(vault_id)
        if entry is None:
            raise locked_error(self.name_of(vault_id))
        new_key = self._slowed(vault_id, lambda: unwrap_key(shared, passphrase))
        try:
            if shared.vault_id != vault_id or not shared.verify_mac(new_key):
                raise VaultCorrupt("the sync target's header was altered: restore its memories-sync.json, or join from a target you trust")
            with self._gate(vault_id):
                key = bytearray(entry.store.key)
                self._close(vault_id, "key change")
                store = VaultStore.open(self.home.vaults / vault_id, key=key)
                try:
                    stats = rekey(store, b"", self.kdf(), parts, adopt=(new_key, shared))
                except BaseException:
                    if not store.closed and store.usable:
                        self._register(store)
                        self._notify_unlocked(vault_id)
                    else:
                        store.close()
                    raise
                self._register(store)
                self._notify_unlocked(vault_id)
        finally:
            crypto.wipe(new_key)
        log.info("vault %s took the key changed on another device", vault_id)
        return {"vault_id": vault_id, **stats}

    def rekey(self, ref: str, old: bytearray, new: bytearray, parts: RekeyParts | None = None) -> dict[str, Any]:
        """New passphrase and a new vault key: the whole vault is sealed again under it
        (:func:`.rekey.rekey`), so a copy of the old header opens nothing written since.

        An unlocked vault is locked first (its in-flight work ends and what it keeps in memory is
        written while the old key is valid), re-sealed by a store that nothing else uses, then
        unlocked again under the new key (the keyring's copy, if any, is replaced). Its two Argon2id
        runs (the old passphrase, the new one) take this process's KDF lock one after the other.
        """
        with self._old_key(ref, old, new) as (vault_id, header, key):
            self._check_header(header, key)
            was_open = self._close(vault_id, "key change")
            store = VaultStore.open(self.home.vaults / vault_id, key=bytearray(key))  # recovers an interrupted write first
            crypto.wipe(key)
            try:
                stats = rekey(store, new, self.kdf(), parts)
            except BaseException:
                if was_open and not store.closed and store.usable:
                    self._register(store)  # nothing changed: the vault stays unlocked, as it was
                    self._notify_unlocked(vault_id)
                else:
                    store.close()
                raise
            try:
                remembered = self._keyring_get(vault_id)
            except KeyringUnreadable:  # logged; a key kept there would open nothing now
                remembered = None
                self._keyring_delete(vault_id)
            if remembered is not None:
                crypto.wipe(remembered)
                try:
                    self.remember(store)
                except KeyringUnavailable:
                    self._keyring_delete(vault_id)  # never keep a key that opens nothing
            if was_open:
                self._register(store)
            else:
                store.close()
        log.info("vault %s: passphrase and key changed", vault_id)
        if was_open:
            self._notify_unlocked(vault_id)
        return {**stats, "unlocked": was_open, "remembered": remembered is not None}

    # ------------------------------------------------------------------ keyring

    def remember(self, store: VaultStore) -> None:
        """Keep the vault key in the OS keyring so unlock needs no passphrase."""
        if getattr(store.key, "wiped", False):
            raise VaultLocked(f"vault {store.name} was locked: unlock it again")
        remember_key(store.vault_id, store.key)

    def _keyring_get(self, vault_id: str) -> bytearray | None:
        """The remembered key or None; :class:`KeyringUnreadable` when the keyring fails to answer."""
        return remembered_key(vault_id)

    def _keyring_delete(self, vault_id: str) -> str | None:
        """Remove the remembered key; a notice for the user when it may still be in the keyring."""
        return forget_key(vault_id)


__all__ = ["VaultManager", "MemoriesError"]
