"""Which requests a vault's process serves and which the router does: the client's side of the method table.

Light on purpose: the CLI, the MCP server and the reliability engines import it, and must not
import the handlers (numpy, the index). So the routing attributes of the method table
(:class:`memoriesd.server.method.Method`: ``route``, ``locked_ok``, ``resend_safe``) are written
here once more, and ``tests/test_method_table.py`` fails when they differ from the table.
"""

from __future__ import annotations

from typing import Any

#: Methods the router always answers itself (``route`` "router" or "both": never carrying vault plaintext).
ROUTER_METHODS = frozenset(
    {
        "daemon.status",
        "daemon.stop",
        "vault.list",
        "vault.overview",
        "vault.lock",
        "vault.delete",
        "vault.route",
        "model.route",
        "rag.watch_reload",
        "rag.model_install",
    }
)
#: Methods that start a worker for a locked vault (``route`` "start": they carry a passphrase or need the key).
START_METHODS = frozenset({"vault.unlock", "vault.passwd"})
#: Methods the router answers while the vault is locked (``locked_ok``: nothing of its content is needed).
LOCKED_OK_METHODS = frozenset({"vault.status"})
#: The method a fresh worker (not yet a vault) serves (``route`` "create").
CREATE_METHOD = "vault.create"
#: The other one: a vault made from a sync target (the router reads the target's header for its id).
JOIN_METHOD = "vault.join"
#: Methods a client sends again when the vault's process ended under them (``resend_safe``): the
#: process locked between the route and the request, so nothing of it ran (an unlock to a process
#: that was ending, a status).
RESEND_WHEN_ENDED = frozenset({"vault.unlock", "vault.status"})
#: Error code of a worker that refused a request because it is ending (its vault just locked):
#: nothing ran, so a client asks for the route again.
ENDING = "vault_process_ending"


def route_request(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The ``vault.route`` params to ask before sending ``method``, or None: send it to the router."""
    if method in ROUTER_METHODS:
        return None
    if method == CREATE_METHOD:
        return {"new": True}
    if method == JOIN_METHOD:
        return {"new": True, "join": params.get("target") if isinstance(params, dict) else None}
    vault = params.get("vault") if isinstance(params, dict) else None
    if not isinstance(vault, str) or not vault:
        return None  # no vault named: the router's (lists, grant.revoke by id...)
    return {"vault": vault, "start": method in START_METHODS, "locked_ok": method in LOCKED_OK_METHODS}


__all__ = [
    "ROUTER_METHODS",
    "START_METHODS",
    "LOCKED_OK_METHODS",
    "CREATE_METHOD",
    "JOIN_METHOD",
    "RESEND_WHEN_ENDED",
    "ENDING",
    "route_request",
]
