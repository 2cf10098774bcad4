"""Shell completion for bash, zsh and fish: commands, options, choices and vault names.

`memories completion SHELL` prints the script (typer's, calling back ``_MEMORIES_COMPLETE=...
memories``). When the shell asks, :func:`complete` answers from the command tree; every vault
argument (a parameter named ``vault``, or whose value is a ``VAULT_ID``) completes vault names.
Names come from memoriesd when it is running (never started for this, and given at most
``DAEMON_WAIT`` seconds), else from the vault headers in the home, where names are plaintext
(``vaults/<id>/header.json``, see docs/format.md). Nothing here runs on a normal command: typer's
completion classes are loaded only when the shell asks.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import typer

COMPLETE_VAR = "_MEMORIES_COMPLETE"
DAEMON_WAIT = 0.5  # seconds: a Tab must never hang on a busy daemon


def _home_of(ctx: Any) -> Any:
    """The home the command line names (`--home`), else $MEMORIES_HOME, else ~/.memories."""
    from memoriesd.home import resolve_home

    root = ctx.find_root() if ctx is not None else None
    explicit = root.params.get("home") if root is not None else None
    return resolve_home(explicit)


def _from_daemon(home: Any) -> list[dict[str, Any]] | None:
    import socket

    from memoriesd.server import protocol

    try:
        home.check_socket_path()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(DAEMON_WAIT)
            sock.connect(str(home.socket_path))
            sock.sendall(protocol.encode({"id": 1, "method": "vault.list", "params": {}}))
            while True:
                msg = protocol.recv_frame(sock)
                if "progress" not in msg:
                    break
    except Exception:  # not running, busy, refused: the headers answer instead
        return None
    result = msg.get("result")
    return list(result["vaults"]) if isinstance(result, dict) and isinstance(result.get("vaults"), list) else None


def _from_headers(home: Any) -> list[dict[str, Any]]:
    import json

    out = []
    try:
        dirs = sorted(p for p in home.vaults.iterdir() if p.is_dir())
    except OSError:
        return []
    for d in dirs:
        try:
            doc = json.loads((d / "header.json").read_text("utf-8"))
            name, vid = str(doc["name"]), str(doc["vault_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if vid == d.name:
            out.append({"vault_id": vid, "name": name})
    return sorted(out, key=lambda v: (v["name"].casefold(), v["vault_id"]))  # as `vault list` orders them


def vault_choices(home: Any) -> list[str]:
    """What a vault argument completes to: each vault's name, or its id when the name is shared."""
    vaults = _from_daemon(home)
    if vaults is None:
        vaults = _from_headers(home)
    names = [str(v.get("name", "")) for v in vaults]
    return [n if names.count(n) == 1 and n else str(v["vault_id"]) for n, v in zip(names, vaults, strict=True)]


def _complete_vault(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    from typer._click.shell_completion import CompletionItem

    return [CompletionItem(c) for c in vault_choices(_home_of(ctx)) if c.startswith(incomplete)]


def _is_vault_param(param: Any) -> bool:
    return param.name == "vault" or str(getattr(param, "metavar", "") or "") == "VAULT_ID"


def attach(command: Any) -> None:
    """Give every vault parameter of the click command tree the vault-name completer."""
    for param in getattr(command, "params", []):
        if _is_vault_param(param):
            param._custom_shell_complete = _complete_vault
    for sub in getattr(command, "commands", {}).values():
        attach(sub)


def complete(app: typer.Typer) -> None:
    """Answer the shell's completion request (``$_MEMORIES_COMPLETE`` is set) and exit."""
    from typer.completion import completion_init

    from .lazy import ON_BUILD

    completion_init()  # typer's bash/zsh/fish classes (add_completion=False leaves them out)
    ON_BUILD.append(attach)  # commands are built as the shell's words reach them (memories_cli/lazy.py)
    command = typer.main.get_command(app)
    attach(command)
    command.main(args=[], prog_name="memories", complete_var=COMPLETE_VAR)  # exits


def script(shell: str) -> str:
    from typer._click.shell_completion import get_completion_class
    from typer.completion import completion_init

    completion_init()
    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - the shells are typer's
        raise typer.BadParameter(f"unsupported shell {shell}")
    return str(cls(None, {}, "memories", COMPLETE_VAR).source())  # type: ignore[arg-type]


def completion(
    shell: Annotated[Literal["bash", "zsh", "fish"], typer.Argument(help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script for bash, zsh or fish.

    It completes commands, options, choices and vault names (from the running daemon, else the
    vault headers in the home). Install it once:

    \b
      bash:  memories completion bash > ~/.local/share/bash-completion/completions/memories
      zsh:   memories completion zsh > ~/.zfunc/_memories   (with fpath+=(~/.zfunc) before compinit)
      fish:  memories completion fish > ~/.config/fish/completions/memories.fish
    """
    sys.stdout.write(script(shell).rstrip("\n") + "\n")


def register(app: typer.Typer) -> None:
    app.command(
        "completion",
        epilog="""Examples:

\b
  memories completion bash > ~/.local/share/bash-completion/completions/memories
  source <(memories completion bash)              # this shell only""",
    )(completion)
