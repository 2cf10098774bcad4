"""What a grant is on the CLI side: its scopes and lifetime as typed, the command an AI client starts
with it, and the one ``grant.create`` request. Shared by ``grant`` (grant_cmds), ``mcp install``
(mcp_install) and the client config files (mcp_clients), none of which import each other for it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from memoriesd.errors import UsageError

from .state import STATE, call, fmt_time, notice

SCOPES = ("search", "read", "retrieve", "ask", "context", "remember", "capture", "forget", "forget-all")
DEFAULT_SCOPE = "search,read,retrieve"  # write scopes (remember, capture, forget, forget-all) only when named
WRITE_SCOPES = ("remember", "capture", "forget", "forget-all")
DEFAULT_TTL = "24h"
GRANT_ENV = "MEMORIES_GRANT"
_TTL = re.compile(r"^([1-9][0-9]{0,9})([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TTL_SECONDS = 10 * 366 * 86400


def parse_ttl(text: str) -> int | None:
    """Seconds for `90s`, `30m`, `8h`, `7d`; None for `never`."""
    value = text.strip().lower()
    if value == "never":
        return None
    m = _TTL.match(value)
    if not m:
        raise UsageError(f"--ttl {text!r} is not a duration: use a number with s, m, h or d (like 90s, 30m, 8h, 7d) or never")
    seconds = int(m.group(1)) * _UNIT[m.group(2)]
    if seconds > MAX_TTL_SECONDS:
        raise UsageError("--ttl is longer than 10 years: use never for a grant without expiry")
    return seconds


def parse_scopes(text: str) -> list[str]:
    items = [s.strip().lower() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in SCOPES]
    if bad or not items:
        raise UsageError(f"--scope takes a comma-separated list of {', '.join(SCOPES)} (default {DEFAULT_SCOPE})")
    if "forget-all" in items:
        items.append("forget")  # forget-all widens forget
    return [s for s in SCOPES if s in items]


def memories_executable() -> list[str]:
    """An absolute command that runs this `memories`: an AI client starts it with its own PATH (often a
    bare one), where a plain `memories` may be missing or another install."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    candidates = [argv0] if argv0 is not None and argv0.name == "memories" else []
    candidates.append(Path(sys.executable).parent / "memories")  # the script beside this interpreter (venv, pipx)
    found = shutil.which("memories")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return [os.path.abspath(c)]
    from memoriesd.workers.process import child_command  # light: no daemon modules

    # Never `python -m`: the AI client's working directory would come first on sys.path.
    return [os.path.abspath(arg) if i == 0 else arg for i, arg in enumerate(child_command("memories_cli.main"))]


def mcp_env(token: str) -> dict[str, str]:
    """The MCP server's environment: the grant, and MEMORIES_HOME unless the home is the default one."""
    env = {GRANT_ENV: token}
    root = STATE.home.root
    if root != (Path.home() / ".memories").expanduser().absolute():
        env["MEMORIES_HOME"] = str(root)
    return env


def client_setup(token: str) -> tuple[str, dict[str, Any]]:
    """The `claude mcp add` line and the JSON `mcpServers` entry for a token (absolute command, home named)."""
    cmd = [*memories_executable(), "mcp"]
    env = mcp_env(token)
    claude = "claude mcp add memories " + " ".join("-e " + shlex.quote(f"{k}={v}") for k, v in env.items())
    claude += " -- " + shlex.join(cmd)
    entry = {"mcpServers": {"memories": {"command": cmd[0], "args": cmd[1:], "env": env}}}
    return claude, entry


def tell_grant(out: dict[str, Any], lead: str) -> None:
    """The lines that describe a new grant (stderr): its id, vault, scopes, expiry, and a warning for
    write scopes."""
    notice(
        f"{lead} {out['grant_id']} for vault {out.get('vault_name') or out['vault_id']}: scopes {','.join(out['scopes'])}"
        f"{', cards only' if out['cards_only'] else ''}, expires {expiry_text(out['expires'])}."
    )
    writes = [s for s in out["scopes"] if s in WRITE_SCOPES]
    if writes:
        notice(f"This grant may change the vault ({', '.join(writes)}): grant write scopes only to tools you trust.")


def create_grant(vault: str, scope: str, ttl: str, *, cards_only: bool = False, label: str = "") -> dict[str, Any]:
    """One `grant.create` request (`grant create` and `mcp install`): the reply holds the token."""
    params: dict[str, Any] = {
        "vault": vault,
        "scopes": parse_scopes(scope),
        "ttl_seconds": parse_ttl(ttl),
        "cards_only": cards_only,
        "label": label,
    }
    return dict(call("grant.create", params))


def expiry_text(expires: float | None) -> str:
    return "never" if expires is None else fmt_time(expires)


__all__ = [
    "DEFAULT_SCOPE",
    "DEFAULT_TTL",
    "GRANT_ENV",
    "SCOPES",
    "WRITE_SCOPES",
    "client_setup",
    "create_grant",
    "expiry_text",
    "mcp_env",
    "parse_scopes",
    "parse_ttl",
    "tell_grant",
]
