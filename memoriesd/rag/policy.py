"""Device-only vaults: no remote model service may see their text.

The check is a pure string check on the configured URL — no DNS lookup, no
connection — so a refused endpoint is never contacted, not even to resolve its
name. What counts as loopback is the one URL rule of :mod:`memoriesd.urls`
(``127.0.0.0/8``, ``::1``, exactly ``localhost``). Loopback services and local
inference keep working.
"""

from __future__ import annotations

from ..errors import DeviceOnly
from ..urls import host_of, is_loopback_url
from ..vault.store import VaultStore

__all__ = ["check_device_policy", "check_store_policy"]


def check_device_policy(device_only: bool, url: str, what: str) -> None:
    """Raise :class:`DeviceOnly` when a device-only vault would send text to a non-loopback ``url``.

    ``what`` names the service for the message ("embedding", "generation", "rerank").
    Call it before any connection is opened for the vault's data.
    """
    if not device_only or is_loopback_url(url):
        return
    host = host_of(url) or "(malformed URL)"
    raise DeviceOnly(
        f"this vault is device-only, so its text may not be sent to the {what} service at {host}: "
        "use local inference or a service on this device (127.0.0.1, ::1, localhost), "
        "or change the vault's device-only policy"
    )


def check_store_policy(store: VaultStore, url: str, what: str) -> None:
    """:func:`check_device_policy` for ``store`` (its ``policy.device_only`` setting)."""
    check_device_policy(bool(store.settings.get("policy.device_only", False)), url, what)
