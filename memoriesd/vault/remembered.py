"""Vault keys remembered in the OS keyring (``vault unlock --remember``), so unlock needs no passphrase.

One entry per vault: service :data:`KEYRING_SERVICE`, account the vault id, the key in base64.
"No keyring on this machine" (``NoKeyringError``, the normal state on headless machines, or no
``keyring`` package) is a state, not a failure: nothing is remembered there. Any other keyring
error is a failure and is never read as "no key stored": a read that fails raises
:class:`KeyringUnreadable`; a delete that fails leaves the key in the keyring, and the caller
gets a one-line notice saying so and what to do (both logged, never with the key).
"""

from __future__ import annotations

import base64
import logging

from ..errors import KeyringUnavailable, MemoriesError
from . import crypto

log = logging.getLogger("memoriesd.vault")

KEYRING_SERVICE = "memories-vault"


class KeyringUnreadable(MemoriesError):
    """The OS keyring failed to answer whether a key is remembered (locked, broken, refused)."""

    code = "keyring_unreadable"


def _no_keyring(exc: BaseException) -> bool:
    """Whether ``exc`` says this machine has no keyring at all (then nothing is stored in one)."""
    if isinstance(exc, ImportError):
        return True
    try:
        from keyring.errors import NoKeyringError
    except ImportError:
        return True
    return isinstance(exc, NoKeyringError)


def _why(exc: BaseException) -> str:
    """The keyring's error in one short line (its type and first line; never a secret of ours)."""
    text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def remember_key(vault_id: str, key: bytes | bytearray) -> None:
    """Keep ``key`` in the OS keyring; :class:`KeyringUnavailable` when there is none that works."""
    try:
        import keyring

        keyring.set_password(KEYRING_SERVICE, vault_id, base64.b64encode(bytes(key)).decode("ascii"))
    except Exception as exc:
        # keyring.errors.NoKeyringError is the normal state on headless machines.
        raise KeyringUnavailable(
            "no OS keyring is available here, so the passphrase is not remembered: the vault works with "
            "its passphrase"
        ) from exc


def remembered_key(vault_id: str) -> bytearray | None:
    """The remembered key; None when none is stored (or this machine has no keyring). A keyring
    that fails to answer raises :class:`KeyringUnreadable` (logged): that is not "none stored"."""
    try:
        import keyring

        value = keyring.get_password(KEYRING_SERVICE, vault_id)
    except Exception as exc:
        if _no_keyring(exc):
            return None
        log.warning("vault %s: the OS keyring could not be read (%s)", vault_id, _why(exc))
        raise KeyringUnreadable(
            f"the OS keyring could not be read ({_why(exc)}), so the remembered key of vault {vault_id} "
            "cannot be used: unlock it with its passphrase, and check that the keyring is unlocked"
        ) from exc
    if not value:
        return None
    try:
        key = bytearray(base64.b64decode(value))
    except ValueError:
        log.warning("vault %s: the key remembered in the OS keyring is malformed; ignored", vault_id)
        return None
    if len(key) != crypto.KEY_BYTES:
        log.warning("vault %s: the key remembered in the OS keyring has the wrong length; ignored", vault_id)
        return None
    return key


def forget_key(vault_id: str) -> str | None:
    """Remove the remembered key. None when none is left (removed, never stored, or no keyring here);
    else a one-line notice (also logged) that it may still be there and what to do."""
    try:
        import keyring

        keyring.delete_password(KEYRING_SERVICE, vault_id)
        return None
    except Exception as exc:
        if _no_keyring(exc):
            return None
        failure: Exception = exc
    try:
        # Most backends raise PasswordDeleteError for an entry that was never stored: not a failure.
        if keyring.get_password(KEYRING_SERVICE, vault_id) is None:
            return None
    except Exception as exc:  # cannot tell: say the entry may still be there (below)
        log.debug("vault %s: keyring re-check failed (%s)", vault_id, _why(exc))
    log.warning("vault %s: its remembered key could not be removed from the OS keyring (%s)", vault_id, _why(failure))
    return (
        f"the key of vault {vault_id} remembered in the OS keyring could not be removed ({_why(failure)}): "
        f"remove the entry service {KEYRING_SERVICE!r}, account {vault_id!r} with your keyring tool "
        f"(e.g. `keyring del {KEYRING_SERVICE} {vault_id}`)"
    )
