"""The purpose keys of one vault key, handed out instead of the key itself.

Code outside :mod:`memoriesd.vault` never sees a vault key's bytes: it asks a :class:`VaultKeys`
for a :class:`~memoriesd.vault.crypto.Sealer` or a subkey bound to one purpose label (the labels
are in :mod:`memoriesd.vault.crypto`), as pyca's Fernet owns its key. Each subkey is derived with
HKDF from the vault key, so a leaked subkey opens nothing of another purpose. The vault key stays
with the store; once the vault is locked (the key wiped) every derivation raises
:class:`~memoriesd.vault.crypto.KeyWiped`.
"""

from __future__ import annotations

from . import crypto


class VaultKeys:
    """Sealers and subkeys per purpose label of one vault key (which it does not expose)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | bytearray) -> None:
        self._key = key

    def sealer(self, label: bytes, context: bytes = b"") -> crypto.Sealer:
        """A sealer for ``label``; the caller wipes it (:meth:`~memoriesd.vault.crypto.Sealer.wipe`) when done."""
        return crypto.Sealer(self._key, label, context)

    def subkey(self, label: bytes, *, context: bytes = b"") -> bytearray:
        """The subkey for ``label``; the caller wipes it (:func:`~memoriesd.vault.crypto.wipe`) when done."""
        return crypto.subkey(self._key, label, context=context)

    def mac(self, label: bytes, data: bytes) -> bytes:
        """HMAC of ``data`` under the subkey for ``label`` (the subkey is wiped before returning)."""
        key = self.subkey(label)
        try:
            return crypto.mac(key, data)
        finally:
            crypto.wipe(key)

    @property
    def wiped(self) -> bool:
        """True once the vault key was wiped (its vault was locked or re-keyed)."""
        return bool(getattr(self._key, "wiped", False))

    def __repr__(self) -> str:
        return "VaultKeys(<hidden>)"


__all__ = ["VaultKeys"]
