"""Crypto recipes: the only module that touches ``cryptography.hazmat``.

A small API over well-kept primitives (pyca/cryptography):

- :func:`derive_kek` — Argon2id from a passphrase (parameters stored in the vault header).
- :func:`subkey` — HKDF-SHA256 with one purpose label per use (magic-wormhole style).
- :func:`seal` / :func:`open_sealed` — AES-256-GCM with a fresh random 96-bit nonce and associated
  data; every failure to open is the same opaque :class:`CryptoFailure`.
- :func:`mac` / :func:`mac_equal` — HMAC-SHA256 and constant-time comparison.

Secrets are held in ``bytearray`` so they can be overwritten (:func:`wipe`); Python cannot
guarantee that no other copy exists (see SECURITY.md).
"""

from __future__ import annotations

import hmac as _hmac
import os
import threading
from hashlib import sha256

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SALT_BYTES = 16
SEAL_OVERHEAD = NONCE_BYTES + TAG_BYTES

# Purpose labels for subkeys. Changing one changes every derived key: never edit, only add.
LABEL_RECORDS = b"memories/v1/records"
LABEL_HEAD = b"memories/v1/head"
LABEL_HEADER_MAC = b"memories/v1/header-mac"
LABEL_FINGERPRINT = b"memories/v1/fragment-fingerprint"
LABEL_VECTORS = b"memories/v1/vectors"
LABEL_VECTOR_NAMES = b"memories/v1/vector-file-names"
LABEL_GRANTS = b"memories/v1/grant-token-hash"
LABEL_LEXICAL_SNAPSHOT = b"memories/v1/lexical-snapshot"
LABEL_RECALLS = b"memories/v1/fact-recalls"
LABEL_SYNC = b"memories/v1/sync"  # sealing what a sync target holds (segments, tips, epoch markers, the name)
LABEL_SYNC_NAMES = b"memories/v1/sync-file-names"  # HMAC key that names the files on a sync target
LABEL_SYNC_STATE = b"memories/v1/sync-state"  # sealing sync-state.bin (this device's sync state)


class CryptoFailure(Exception):
    """Opaque: a sealed blob did not open (wrong key, wrong associated data, or damage)."""


class KeyWiped(Exception):
    """A key was used after it was wiped (its vault was locked): nothing was sealed or opened.

    The daemon answers it as ``vault_locked``. Without this, a wiped key is 32 zero bytes and
    would still seal (see SECURITY.md, "What is wiped").
    """


class Secret(bytearray):
    """Key material that refuses use once :func:`wipe` has overwritten it."""

    wiped = False


def _usable(key: bytes | bytearray) -> None:
    if getattr(key, "wiped", False):
        raise KeyWiped("the key was wiped (its vault was locked)")


# Two Argon2id derivations at once in threads (cryptography 50, lanes=4) never return on some
# machines, and no later one does either: every derivation in the process takes this lock.
_KDF_LOCK = threading.Lock()


def random_bytes(n: int) -> bytes:
    return os.urandom(n)


def new_key() -> Secret:
    return Secret(os.urandom(KEY_BYTES))


def wipe(buf: bytearray | None) -> None:
    """Overwrite a secret in place; a :class:`Secret` refuses every later use."""
    if buf is None:
        return
    buf[:] = bytes(len(buf))
    if isinstance(buf, Secret):
        buf.wiped = True


def derive_kek(passphrase: bytes | bytearray, salt: bytes, *, memory_kib: int, iterations: int, lanes: int) -> bytearray:
    """Key-encryption key from a passphrase with Argon2id; one derivation at a time per process."""
    if len(salt) != SALT_BYTES:
        raise CryptoFailure("bad salt")
    kdf = Argon2id(
        salt=bytes(salt),
        length=KEY_BYTES,
        iterations=iterations,
        lanes=lanes,
        memory_cost=memory_kib,
    )
    with _KDF_LOCK:
        return Secret(kdf.derive(bytes(passphrase)))


def subkey(master: bytes | bytearray, label: bytes, *, context: bytes = b"") -> bytearray:
    """A purpose-labelled subkey of ``master`` (HKDF-SHA256)."""
    _usable(master)
    if len(master) != KEY_BYTES:
        raise CryptoFailure("bad key length")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=label + b"|" + context)
    return Secret(hkdf.derive(bytes(master)))


def seal(key: bytes | bytearray, plaintext: bytes, aad: bytes) -> bytes:
    """``nonce || ciphertext || tag`` of ``plaintext`` bound to ``aad``."""
    _usable(key)
    if len(key) != KEY_BYTES:
        raise CryptoFailure("bad key length")
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(bytes(key)).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes | bytearray, blob: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`seal`. Any failure (length, type, tag) is one :class:`CryptoFailure`."""
    _usable(key)
    if len(key) != KEY_BYTES:
        raise CryptoFailure("cannot open")
    return _open_with(AESGCM(bytes(key)), blob, aad)


def _open_with(aead: AESGCM, blob: bytes | bytearray | memoryview, aad: bytes) -> bytes:
    """Open ``nonce || ciphertext || tag`` with a ready cipher object; ``blob`` may be a memoryview
    into a larger buffer (a log or a sidecar read whole): nothing is copied before decryption."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CryptoFailure("cannot open")
    view = memoryview(blob)
    if view.ndim != 1 or view.itemsize != 1 or len(view) < SEAL_OVERHEAD:
        raise CryptoFailure("cannot open")
    try:
        return aead.decrypt(view[:NONCE_BYTES], view[NONCE_BYTES:], aad)
    except (InvalidTag, ValueError, TypeError, BufferError) as exc:
        raise CryptoFailure("cannot open") from exc


def mac(key: bytes | bytearray, data: bytes) -> bytes:
    _usable(key)
    return _hmac.new(bytes(key), data, sha256).digest()


def mac_equal(a: bytes, b: bytes) -> bool:
    return _hmac.compare_digest(a, b)


def digest(data: bytes) -> bytes:
    return sha256(data).digest()


def digest_pair(first: bytes, second: bytes | memoryview) -> bytes:
    """``digest(first + second)`` without building the concatenation."""
    h = sha256(first)
    h.update(second)
    return h.digest()


class Sealer:
    """A subkey bound to a purpose, with seal/open methods (handy to pass as callables)."""

    def __init__(self, master: bytes | bytearray, label: bytes, context: bytes = b"") -> None:
        self._key = subkey(master, label, context=context)
        # One cipher object for the sealer's life instead of one per call (each call also made an
        # immutable copy of the key): unlock opens one log entry per record. Dropped by wipe().
        self._aead: AESGCM | None = AESGCM(bytes(self._key))

    def _cipher(self) -> AESGCM:
        aead = self._aead
        if aead is None or getattr(self._key, "wiped", False):
            raise KeyWiped("the key was wiped (its vault was locked)")
        return aead

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        aead = self._cipher()
        nonce = os.urandom(NONCE_BYTES)
        return nonce + aead.encrypt(nonce, plaintext, aad)

    def open(self, blob: bytes | bytearray | memoryview, aad: bytes) -> bytes:
        """Inverse of :meth:`seal`; ``blob`` may be a memoryview (no copy). One opaque
        :class:`CryptoFailure` for every failure."""
        return _open_with(self._cipher(), blob, aad)

    def wipe(self) -> None:
        self._aead = None
        wipe(self._key)
