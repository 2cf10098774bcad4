"""How often each fact was recalled: a sealed side file per vault, written in batches.

Every time a fact is used in a context pack (``rag context``) or returned by a search
(``rag search``, ``memory search``, ``rag ask``'s citations), its counter goes up by one and its
last-recall time is set. Counters are kept in ``vaults/<vault_id>/recalls.bin``: one AES-256-GCM
sealed JSON object ``{record id: [count, last recall (Unix time)]}`` under the vault's
``memories/v1/fact-recalls`` subkey, bound to the vault id (associated data), replaced atomically.

Why a side file and not the record: a recall is not an edit. A new revision per recall would fill
the fact's history (what it used to *say*) and the append-only log with noise; a side file is
rewritten in place and carries no text. Writes are batched: at most one every
:data:`FLUSH_SECONDS` while recalls come in, and the rest when the vault locks (the counters are an
attachment of the unlocked vault, closed while its key is still valid). A crash loses at most the
last :data:`FLUSH_SECONDS` of counts. Entries of records that are no longer current facts (deleted,
forgotten) are dropped at each write; ``memory forget`` rewrites the file at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable

from ..vault import crypto, fsio
from ..vault.format import atomic_write
from ..vault.live import LiveVault
from ..vault.rekey import Rekeying
from ..vault.store import VaultStore

log = logging.getLogger("memoriesd.memory")

RECALLS_NAME = "recalls.bin"
ATTACHMENT = "fact-recalls"
MAGIC = b"MEMRC1\n"
#: Purpose label of the subkey that seals the counters (never edit: it would orphan every file).
#: While recalls come in, the file is written at most this often.
FLUSH_SECONDS = 30.0


def _aad(vault_id: str) -> bytes:
    return b"memories/recalls/v1|" + vault_id.encode("utf-8")


class Recalls:
    """Recall counters of one unlocked vault's facts (an attachment of its LiveVault)."""

    def __init__(self, store: VaultStore) -> None:
        self.store = store
        self.path = store.dir / RECALLS_NAME
        self._lock = threading.Lock()
        self._counts: dict[str, list[float]] | None = None  # id -> [count, last]; None until read
        self._sealer: crypto.Sealer | None = None
        self._dirty = False
        self._flushed = 0.0  # monotonic time of the last write

    def _seal(self) -> crypto.Sealer:
        if self._sealer is None:
            self._sealer = self.store.keys.sealer(crypto.LABEL_RECALLS)
        return self._sealer

    def _load(self) -> dict[str, list[float]]:
        """Caller holds ``_lock``."""
        if self._counts is None:
            counts: dict[str, list[float]] = {}
            try:
                blob = self.path.read_bytes()
            except FileNotFoundError:
                blob = b""
            except OSError as exc:
                log.warning("vault %s: cannot read the recall counters (%s)", self.store.vault_id, exc.strerror)
                blob = b""
            if blob:
                try:
                    if not blob.startswith(MAGIC):
                        raise ValueError("magic")
                    doc = json.loads(self._seal().open(blob[len(MAGIC) :], _aad(self.store.vault_id)))
                    counts = {str(k): [int(v[0]), float(v[1])] for k, v in dict(doc).items()}
                except (crypto.CryptoFailure, ValueError, TypeError, KeyError, IndexError):
                    log.warning("vault %s: the recall counters are unreadable; they start again from zero", self.store.vault_id)
                    counts = {}
            self._counts = counts
        return self._counts

    def note(self, record_ids: Iterable[str], when: float | None = None) -> None:
        """Count one recall of each fact in ``record_ids`` (each counts once per call)."""
        ids = list(dict.fromkeys(record_ids))
        if not ids:
            return
        t = round(time.time() if when is None else when, 3)
        with self._lock:
            counts = self._load()
            for rid in ids:
                entry = counts.setdefault(rid, [0, 0.0])
                entry[0] = int(entry[0]) + 1
                entry[1] = t
            self._dirty = True
            if time.monotonic() - self._flushed >= FLUSH_SECONDS:
                self._flush_locked()

    def get(self, record_id: str) -> tuple[int, float | None]:
        with self._lock:
            entry = self._load().get(record_id)
        return (0, None) if entry is None else (int(entry[0]), float(entry[1]))

    def drop(self, record_ids: Iterable[str]) -> None:
        """Forget the counters of these records and rewrite the file now (``memory forget``)."""
        with self._lock:
            counts = self._load()
            for rid in record_ids:
                counts.pop(rid, None)
            self._dirty = True
            self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            if self._dirty:
                self._flush_locked()

    def _flush_locked(self) -> None:
        counts = self._load()
        live = {rid for rid, rec in self.store.current(counts).items() if rec.kind == "fact"}  # only current facts are kept
        for rid in [r for r in counts if r not in live]:
            del counts[rid]
        try:
            if counts:
                plain = json.dumps(counts, separators=(",", ":"), sort_keys=True).encode("ascii")
                atomic_write(self.path, MAGIC + self._seal().seal(plain, _aad(self.store.vault_id)))
            else:
                fsio.unlink(self.path, missing_ok=True)
        except OSError as exc:
            log.warning("vault %s: the recall counters were not written (%s)", self.store.vault_id, exc.strerror)
            return
        self._dirty = False
        self._flushed = time.monotonic()

    def close(self) -> None:
        """At lock (key still valid): write what is pending, then wipe the subkey."""
        with self._lock:
            try:
                if self._dirty:
                    self._flush_locked()
            except crypto.KeyWiped:
                pass
            finally:
                if self._sealer is not None:
                    self._sealer.wipe()
                self._sealer = None
                self._counts = None


def rekey_recalls(rk: Rekeying) -> dict[str, int]:
    """A key change's stage for the counters (:class:`~memoriesd.vault.rekey.Rekeying`): the file
    sealed again under the new key, as it is. An unreadable file is not carried over (counters
    start from zero, as they would)."""
    store = rk.store
    try:
        blob = (store.dir / RECALLS_NAME).read_bytes()
    except FileNotFoundError:
        return {}
    old = store.keys.sealer(crypto.LABEL_RECALLS)
    new = rk.new_keys.sealer(crypto.LABEL_RECALLS)
    try:
        try:
            if not blob.startswith(MAGIC):
                raise ValueError("magic")
            plain = old.open(blob[len(MAGIC) :], _aad(store.vault_id))
        except (crypto.CryptoFailure, ValueError):
            log.warning("vault %s: the recall counters are unreadable; they start again from zero", store.vault_id)
            return {}
        atomic_write(rk.staged(RECALLS_NAME), MAGIC + new.seal(plain, _aad(store.vault_id)))
        return {"recall_counters": len(json.loads(plain))}
    finally:
        old.wipe()
        new.wipe()


def recalls_of(vault: LiveVault) -> Recalls:
    """The vault's counters, an attachment of its lease (``vault_locked`` once it is closing)."""
    return vault.attachment(ATTACHMENT, lambda: Recalls(vault.store))


def note_recalls(vault: LiveVault, record_ids: Iterable[str]) -> int:
    """Count a recall of every fact among ``record_ids`` (other kinds are ignored). Never fails the
    request it is part of: a failure is logged. Returns how many facts were counted."""
    store = vault.store
    try:
        ids = list(dict.fromkeys(record_ids))
        current = store.current(ids)
        facts = [rid for rid in ids if rid in current and current[rid].kind == "fact"]
        if facts:
            recalls_of(vault).note(facts)
        return len(facts)
    except Exception as exc:  # noqa: BLE001 - counting must never cost a search its answer
        log.warning("vault %s: recalls not counted (%s)", store.vault_id, type(exc).__name__)
        return 0


__all__ = ["ATTACHMENT", "FLUSH_SECONDS", "RECALLS_NAME", "Recalls", "note_recalls", "recalls_of", "rekey_recalls"]
