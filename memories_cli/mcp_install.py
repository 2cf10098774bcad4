"""`memories mcp install|uninstall CLIENT`: connect an AI client to a vault in one command.

`install` creates a grant (the one `grant.create` request of `grant create`) and writes the
client's own configuration entry: the absolute `memories` command, `mcp`, and the grant token and
MEMORIES_HOME in its environment (exactly what `grant create` prints). `uninstall` removes the
entry and revokes its grant. The files and their formats are in :mod:`memories_cli.mcp_clients`.

`memories mcp` with no sub-command is still the MCP server the client starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from memoriesd.errors import MemoriesError, NotFound, UsageError

from .grant_setup import DEFAULT_SCOPE, client_setup, create_grant, tell_grant
from .state import STATE, call, cli_command, emit_json, fmt_time, notice

if TYPE_CHECKING:
    from .mcp_clients import Client

mcp_app = typer.Typer(  # its help is `grant_cmds.mcp`'s docstring (the server, scopes, set-up)
    rich_markup_mode=None,
    no_args_is_help=False,
    invoke_without_command=True,
)

ClientName = Literal["claude-code", "claude-desktop", "cursor", "codex"]
DEFAULT_NAME = "memories"
INSTALL_TTL = "30d"  # a client configuration outlives a terminal session; `grant create` keeps 24h

ClientArg = Annotated[ClientName, typer.Argument(help="The AI client: claude-code, claude-desktop, cursor or codex.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Edit this file (same format) instead of the client's user configuration, e.g. a project's "
        ".mcp.json; it holds the token, so keep it out of version control.",
    ),
]
NameOpt = Annotated[str, typer.Option("--name", help="The server's name in the client's configuration.")]


def _client(name: str) -> Client:
    from .mcp_clients import CLIENTS  # loaded when an install runs: start-up time is a feature

    return CLIENTS[name]


def _path(client: Client, config: Path | None) -> Path:
    from .mcp_clients import config_path

    return config.expanduser().absolute() if config is not None else config_path(client)


def _revoke(grant_id: str) -> str | None:
    """Revoke one grant; None when done (or already gone), else why it was not."""
    try:
        call("grant.revoke", {"grant_id": grant_id})
    except NotFound:
        return None  # revoked or expired before: nothing is left to revoke
    except MemoriesError as exc:
        return exc.message
    return None


@mcp_app.command(
    "install",
    epilog="""Examples:

\b
  memories mcp install claude-code notes
  memories mcp install cursor notes --scope search,read,retrieve,context --ttl 90d
  memories mcp install codex notes --name memories-work
  memories mcp install claude-desktop notes --print      # show the entry, write nothing""",
)
def install(
    client: ClientArg,
    vault: Annotated[str, typer.Argument(help="The vault (id or name) the client may reach; it must be unlocked.")],
    scope: Annotated[
        str,
        typer.Option("--scope", help="Comma-separated grant scopes, as for `grant create` (write scopes only when named)."),
    ] = DEFAULT_SCOPE,
    ttl: Annotated[str, typer.Option("--ttl", help="Grant lifetime: 90s, 30m, 8h, 7d or never.")] = INSTALL_TTL,
    cards_only: Annotated[bool, typer.Option("--cards-only", help="Limit every tool to ingested knowledge cards.")] = False,
    label: Annotated[str, typer.Option("--label", help="A note for `grant list` (default: the client's name).")] = "",
    name: NameOpt = DEFAULT_NAME,
    config: ConfigOpt = None,
    print_: Annotated[bool, typer.Option("--print", help="Print the entry (with its token) instead of writing it.")] = False,
) -> None:
    """Create a grant and add it to an AI client's MCP configuration.

    The entry runs this `memories` (absolute path) as `memories mcp` with the grant token and
    MEMORIES_HOME in its environment. Other servers and keys in the file are kept, the old file
    is saved as FILE.bak.TIMESTAMP, and a server of the same name that is not Memories is never
    replaced. Restart the client afterwards. The grant expires after --ttl (30 days by default):
    run the same command again to renew it; `memories mcp uninstall` removes it.
    """
    from .mcp_clients import ConfigFile, client_entry, memories_grant, readable_by_others, snippet

    c = _client(client)
    if not name.strip():
        raise UsageError("--name is empty: name the server, e.g. --name memories")
    path = _path(c, config)
    cfg: ConfigFile | None = None
    if not print_:
        cfg = ConfigFile(c, path)  # a malformed file stops us before any grant exists
        existing = cfg.get(name)
        if existing is not None and memories_grant(existing) is None:
            raise UsageError(
                f"{path} already has a server named {name} that is not Memories (left untouched): choose another --name"
            )
    out = create_grant(vault, scope, ttl, cards_only=cards_only, label=label or c.key)
    _, setup = client_setup(out["token"])
    spec = setup["mcpServers"]["memories"]
    entry = client_entry(c, spec["command"], spec["args"], spec["env"])
    summary = {k: out[k] for k in ("grant_id", "vault_id", "scopes", "cards_only", "expires")}
    if print_:
        if STATE.json:
            emit_json({"client": c.key, "file": str(path), "name": name, "entry": entry, **summary})
            return
        notice(f"Created grant {out['grant_id']} for vault {out['vault_id']}, expires {_expiry(out['expires'])}.")
        notice(f"Add this to {path} (the token is shown only now), then restart {c.title}:")
        print(snippet(c, name, entry), end="")
        return
    assert cfg is not None
    replaced = memories_grant(cfg.get(name))
    if replaced is not None and replaced.vault_id != out["vault_id"]:
        _revoke(out["grant_id"])
        raise UsageError(
            f"the server {name} in {path} already connects vault {replaced.vault_id}: pass another --name "
            f"(e.g. --name memories-{out['vault_id']}) or run `{cli_command('mcp', 'uninstall', c.key, '--name', name)}` first"
        )
    cfg.set(name, entry)
    backup = cfg.save()
    leftover = _revoke(replaced.grant_id) if replaced is not None and replaced.grant_id != out["grant_id"] else None
    if STATE.json:
        emit_json({"client": c.key, "file": str(path), "name": name, "backup": str(backup) if backup else None,
                   "replaced_grant_id": replaced.grant_id if replaced else None, **summary})
    else:
        verb = "Replaced" if replaced is not None else "Added"
        notice(f"{verb} the server {name} in {path}" + (f" (backup: {backup.name})." if backup else "."))
        tell_grant(out, "Grant")
        if readable_by_others(path):
            notice(f"{path} is readable by other users and now holds a grant token: run `chmod 600 {path}`.")
        notice(f"Restart {c.title} to connect it; the vault must be unlocked while it is used.")
    if leftover is not None:
        notice(f"the replaced grant {replaced.grant_id if replaced else ''} was not revoked ({leftover}): "
               f"run `{cli_command('grant', 'revoke', replaced.grant_id if replaced else '')}`")


@mcp_app.command(
    "uninstall",
    epilog="""Examples:

\b
  memories mcp uninstall claude-code             # the server named memories
  memories mcp uninstall cursor notes            # every Memories server of vault notes""",
)
def uninstall(
    client: ClientArg,
    vault: Annotated[str | None, typer.Argument(help="Remove every Memories server of this vault (id or name).")] = None,
    name: NameOpt = DEFAULT_NAME,
    config: ConfigOpt = None,
) -> None:
    """Remove Memories from an AI client's configuration and revoke its grant.

    Without VAULT the server named --name (default memories) is removed; it must be a Memories
    entry. Other servers and keys stay, and the old file is saved as FILE.bak.TIMESTAMP.
    """
    from .mcp_clients import ConfigFile, memories_grant

    c = _client(client)
    path = _path(c, config)
    cfg = ConfigFile(c, path)
    if not cfg.existed:
        raise NotFound(f"{path} does not exist: {c.title} has no Memories server to remove")
    ours = {n: g for n, e in cfg.servers().items() if (g := memories_grant(e)) is not None}
    if vault is not None:
        ids = {vault}
        if not any(g.vault_id == vault for g in ours.values()):  # a name: ask the daemon which vault(s) it names
            ids = {v["vault_id"] for v in call("vault.list")["vaults"] if v["name"] == vault}
        chosen = {n: g for n, g in ours.items() if g.vault_id in ids}
        if not chosen:
            raise NotFound(f"{path} has no Memories server for vault {vault}: see the file, or pass --name")
    else:
        if cfg.get(name) is None:
            raise NotFound(f"{path} has no server named {name}: pass --name, or VAULT to remove a vault's servers")
        if name not in ours:
            raise UsageError(f"the server {name} in {path} is not a Memories entry (left untouched): pass the right --name")
        chosen = {name: ours[name]}
    for n in chosen:
        cfg.remove(n)
    backup = cfg.save()
    failed = {g.grant_id: why for g in chosen.values() if (why := _revoke(g.grant_id)) is not None}
    if STATE.json:
        emit_json({"client": c.key, "file": str(path), "removed": sorted(chosen), "backup": str(backup) if backup else None,
                   "revoked": sorted(g.grant_id for g in chosen.values() if g.grant_id not in failed),
                   "not_revoked": sorted(failed)})
    else:
        notice(f"Removed {', '.join(sorted(chosen))} from {path}" + (f" (backup: {backup.name})." if backup else "."))
        notice(f"Restart {c.title} to disconnect it.")
    if failed:
        gid, why = next(iter(failed.items()))
        raise MemoriesError(
            f"the entry is removed but grant {gid} was not revoked ({why}): run `{cli_command('grant', 'revoke', gid)}`",
            code="grant_not_revoked",
        )


def _expiry(expires: float | None) -> str:
    return "never" if expires is None else fmt_time(expires)


def register_mcp(app: typer.Typer, serve: Any, epilog: str) -> None:
    """`memories mcp` (``serve`` when no sub-command is given) with `install` and `uninstall`."""
    mcp_app.callback(invoke_without_command=True, epilog=epilog)(serve)
    app.add_typer(mcp_app, name="mcp")
