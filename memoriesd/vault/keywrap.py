"""How a passphrase guards a vault key: Argon2id parameters, wrapping and unwrapping the key in
``header.json``, and a header with a fresh salt for a new passphrase.

The lowest layer that both :mod:`.store` (create, open, re-wrap) and :mod:`.rekey` (a new key
under a new passphrase) build on, so that neither needs the other's private helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import BadPassphrase
from . import crypto
from .format import Header, b64d, b64e


def why(exc: BaseException) -> str:
    """What the OS said, for a one-line message (never a path or any vault content)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@dataclass(frozen=True)
class KdfParams:
    memory_kib: int = 65536
    iterations: int = 3
    lanes: int = 4


def kdf_fields(kdf: KdfParams) -> dict[str, Any]:
    """The ``kdf`` object of a header: Argon2id with these costs and a fresh random salt."""
    return {
        "alg": "argon2id",
        "memory_kib": kdf.memory_kib,
        "iterations": kdf.iterations,
        "lanes": kdf.lanes,
        "salt": b64e(crypto.random_bytes(crypto.SALT_BYTES)),
    }


def _kek(header: Header, passphrase: bytes | bytearray) -> bytearray:
    kdf = header.kdf
    return crypto.derive_kek(
        passphrase, b64d(kdf["salt"]), memory_kib=kdf["memory_kib"], iterations=kdf["iterations"], lanes=kdf["lanes"]
    )


def wrap_key(header: Header, passphrase: bytes | bytearray, vault_key: bytearray) -> None:
    """Seal ``vault_key`` into ``header`` under ``passphrase`` (its salt and KDF costs) and MAC it."""
    kek = _kek(header, passphrase)
    try:
        header.wrap = b64e(crypto.seal(kek, bytes(vault_key), header.wrap_aad()))
    finally:
        crypto.wipe(kek)
    header.mac = header.compute_mac(vault_key)


def unwrap_key(header: Header, passphrase: bytes | bytearray) -> bytearray:
    """Vault key from the passphrase; ``bad_passphrase`` when it does not open."""
    kek = _kek(header, passphrase)
    try:
        key = bytearray(crypto.open_sealed(kek, b64d(header.wrap), header.wrap_aad()))
    except crypto.CryptoFailure as exc:
        raise BadPassphrase(
            f"wrong passphrase for vault {header.name}: try again (a lost passphrase cannot be recovered)"
        ) from exc
    finally:
        crypto.wipe(kek)
    if len(key) != crypto.KEY_BYTES:
        raise BadPassphrase(f"wrong passphrase for vault {header.name}: try again")
    return key


def new_header(header: Header, passphrase: bytes | bytearray, key: bytearray, kdf: KdfParams) -> Header:
    """A copy of ``header`` with a new salt, ``key`` wrapped under ``passphrase`` (Argon2id) and its MAC."""
    out = replace(header)
    out.kdf = kdf_fields(kdf)
    wrap_key(out, passphrase, key)
    return out


__all__ = ["KdfParams", "kdf_fields", "new_header", "unwrap_key", "why", "wrap_key"]
