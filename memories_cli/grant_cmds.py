"""`memories grant ...`, `memories mcp` and `memories inject`: AI clients with scoped, revocable grants."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError

from .formats import ColorOpt, Listing, PlainFormatOpt, chosen, emit
from .grant_setup import (
    DEFAULT_SCOPE,
    DEFAULT_TTL,
    GRANT_ENV,
    client_setup,
    create_grant,
    expiry_text,
    tell_grant,
)
from .state import STATE, call, cli_command, emit_json, fmt_time, notice, table

grant_app = typer.Typer(help="Create, list and revoke grants that let AI tools reach one vault.", no_args_is_help=True, rich_markup_mode=None)


@grant_app.command(
    "create",
    epilog="""Examples:

\b
  memories grant create notes                   # scopes search, read, retrieve; 24 hours
  memories grant create notes --scope search,ask,context --ttl 7d --label claude
  memories grant create notes --scope search,context,remember --cards-only""",
)
def create(
    vault: Annotated[str, typer.Argument(help="The vault (id or name) the grant may reach; it must be unlocked.")],
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            help="Comma-separated scopes. Reading: search, read, retrieve, ask, context. Writing (never a default): "
            "remember (add or revise facts), capture (file a conversation), forget, forget-all (every fact, or every "
            "record of a kind; implies forget).",
        ),
    ] = DEFAULT_SCOPE,
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime: 90s, 30m, 8h, 7d or never.")] = DEFAULT_TTL,
    cards_only: Annotated[bool, typer.Option("--cards-only", help="Limit every tool to ingested knowledge cards.")] = False,
    label: Annotated[str, typer.Option("--label", help="A note for `grant list` (e.g. which tool uses it).")] = "",
) -> None:
    """Create a grant for an AI tool and print its token once.

    The token comes with the MCP client set-up for it: a `claude mcp add` line and an mcpServers entry.
    """
    out = create_grant(vault, scope, ttl, cards_only=cards_only, label=label)
    if STATE.json:
        emit_json({k: out[k] for k in ("grant_id", "token", "vault_id", "scopes", "cards_only", "expires")})
        return
    token = out["token"]
    claude, entry = client_setup(token)
    tell_grant(out, "Created grant")
    notice("The token is shown only now. Anyone holding it can use these scopes while the vault is unlocked;")
    notice(f"revoke it with `memories grant revoke {out['grant_id']}`.")
    print(f"token: {token}")
    print()
    print("Claude Code:")
    print(f"  {claude}")
    print()
    print("Other MCP clients (mcpServers entry):")
    print(json.dumps(entry, indent=2))


@grant_app.command("list")
def list_(
    vault: Annotated[str | None, typer.Argument(help="Only this vault (default: every unlocked vault).")] = None,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """List grants; tokens are never shown.

    Each grant with its id, label, scopes, expiry and last use.
    """
    fmt = chosen(format_, color)
    out = call("grant.list", {"vault": vault} if vault else {})
    names = out.get("locked_vault_names") or {}
    for vid in out.get("locked_vaults", []):
        ref = names.get(vid, vid)  # the vault's name (an older daemon sends ids only)
        notice(f"vault {ref} is locked: its grants are sealed inside it (run `{cli_command('vault', 'unlock', ref)}` to list them)")
    grants = out["grants"]  # the daemon's grant views: never a token

    def text() -> None:
        now = time.time()
        rows = []
        for g in grants:
            expiry = expiry_text(g["expires"]) + (" (expired)" if g["expires"] is not None and g["expires"] <= now else "")
            scopes = ",".join(g["scopes"]) + (" cards-only" if g["cards_only"] else "")
            rows.append([g["grant_id"], g["vault_id"], g["label"], scopes, expiry, fmt_time(g["last_used"]) or "never"])
        table(["GRANT_ID", "VAULT_ID", "LABEL", "SCOPES", "EXPIRES", "LAST USE"], rows)

    emit(fmt, Listing(
        document={"grants": grants, "locked_vaults": out.get("locked_vaults", [])},
        items=grants,
        columns=("grant_id", "vault_id", "label", "scopes", "cards_only", "created", "expires", "expired", "last_used"),
        text=text,
        md_item=_md_grant,
    ))


def _md_grant(g: dict[str, Any]) -> str:
    from .formats import md_escape

    scopes = ",".join(g["scopes"]) + (" (cards only)" if g["cards_only"] else "")
    expiry = expiry_text(g["expires"]) + (" (expired)" if g.get("expired") else "")
    return (
        f"- **{md_escape(str(g['label'] or '')) or '(no label)'}** `{g['grant_id']}` \u00b7 vault `{g['vault_id']}` \u00b7 "
        f"scopes {scopes} \u00b7 expires {expiry} \u00b7 last used {fmt_time(g['last_used']) or 'never'}"
    )


@grant_app.command("revoke")
def revoke(
    grant_id: Annotated[str | None, typer.Argument(help="The grant to revoke (see `memories grant list`).")] = None,
    all_: Annotated[str | None, typer.Option("--all", metavar="VAULT_ID", help="Revoke every grant of this vault.")] = None,
) -> None:
    """Revoke a grant now, or all of a vault's.

    The next call, and any call in flight, is refused.
    """
    if (grant_id is None) == (all_ is None):
        raise UsageError("give either a GRANT_ID or --all VAULT_ID")
    params: dict[str, Any] = {"all": True, "vault": all_} if all_ is not None else {"grant_id": grant_id}
    out = call("grant.revoke", params)
    if STATE.json:
        emit_json(out)
        return
    if not out["revoked"]:
        notice(f"vault {out['vault_id']} had no grants.")
    for gid in out["revoked"]:
        notice(f"Revoked grant {gid} of vault {out['vault_id']}.")


def mcp(
    ctx: typer.Context,
    grant_file: Annotated[
        Path | None, typer.Option("--grant-file", help=f"Read the grant token from this file (else ${GRANT_ENV}).")
    ] = None,
) -> None:
    """Serve MCP over stdio for an AI client, limited to one grant.

    The AI client starts this command itself. Create a grant first (`memories grant create VAULT`):
    its token, in $MEMORIES_GRANT or a file named by --grant-file, decides the one vault and the
    scopes (tools) the client gets. `grant create` prints the set-up lines for the token it makes.

    Scopes: search, read and retrieve (the default), ask and context read the vault; remember, capture,
    forget and forget-all change it and are given only when named. A grant expires (--ttl, default 24h),
    is revoked with `memories grant revoke`, and works only while its vault is unlocked. The set-up
    names this `memories` by its absolute path, and MEMORIES_HOME when the home is not ~/.memories.
    `memories mcp install CLIENT VAULT` does all of this for Claude Code, Claude Desktop, Cursor or Codex.
    """
    if ctx.invoked_subcommand is not None:
        return  # `mcp install` / `mcp uninstall`
    if grant_file is not None:
        try:
            token = grant_file.read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the grant file {grant_file}: check the path and its permissions") from exc
    else:
        token = os.environ.get(GRANT_ENV, "").strip()
    if not token:
        raise UsageError(
            f"no grant: create one with `memories grant create VAULT_ID` and pass its token in ${GRANT_ENV} "
            "or with --grant-file"
        )
    if not token.startswith("mg_") or token.count("_") < 3:
        raise UsageError("the grant token is malformed: copy it again, or create a new one with `memories grant create VAULT_ID`")
    from .mcp_server import serve

    serve(STATE.home, token)


def inject(
    target: Annotated[str, typer.Argument(help="all, claude (~/.claude/skills) or agents (~/.agents/skills).")] = "all",
    directory: Annotated[Path | None, typer.Option("--dir", help="Write into this skills folder instead.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the skill even if it was edited.")] = False,
) -> None:
    """Install the Memories skill into AI clients' skill folders.

    The skill is memories/SKILL.md, written under each client's skills folder.
    """
    from .skill import inject as do_inject

    results = do_inject(target, directory, force=force)
    if STATE.json:
        emit_json({"results": [{"path": str(r.path), "action": r.action} for r in results]})
        return
    for r in results:
        print(r.message)


def register(app: typer.Typer) -> None:
    from .mcp_install import register_mcp

    app.add_typer(grant_app, name="grant")
    register_mcp(
        app,
        mcp,
        epilog="""Examples:

\b
  memories mcp install claude-code notes           # grant + Claude Code's config entry in one command
  memories grant create notes --label claude        # prints the token and the lines below
  claude mcp add memories -e MEMORIES_GRANT=mg_... -e MEMORIES_HOME=/srv/mem -- /usr/local/bin/memories mcp
  {"mcpServers": {"memories": {"command": "/usr/local/bin/memories", "args": ["mcp"],
                               "env": {"MEMORIES_GRANT": "mg_...", "MEMORIES_HOME": "/srv/mem"}}}}""",
    )
    app.command("inject")(inject)


__all__ = ["register"]
