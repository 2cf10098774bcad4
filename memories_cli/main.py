"""`memories`: the thin CLI. Parse → one request to memoriesd → render.

Heavy modules (numpy, onnxruntime, jieba, tokenizers) are never imported here: start-up is a feature.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from memoriesd import __version__
from memoriesd.errors import MemoriesError, UsageError

from .lazy import Lazy, root_class
from .state import STATE, fail

#: Every top-level command, in the order `memories --help` lists them (daily use first). A new command
#: or group joins with one line: its name, its one-line summary (the first sentence of its help; a
#: test holds them equal) and where it lives, ``"module:typer_app"`` or ``"module:register"`` (a
#: function given the app). Nothing here is imported until its command runs (memories_cli/lazy.py).
COMMANDS: tuple[Lazy, ...] = (
    Lazy(
        "status",
        "Every vault at a glance: locked or unlocked, records, index and embedding progress, auto-lock, grants.",
        ("memories_cli.status_cmds:register",),
    ),
    Lazy("vault", "Create, unlock, lock and manage encrypted vaults.", ("memories_cli.vault_cmds:vault_app",)),
    Lazy("memory", "Keep notes, credentials and files in a vault.", (
        "memories_cli.memory_cmds:memory_app",
        "memories_cli.forget_cmds:register",  # memory forget
        "memories_cli.rag_cmds:register_memory_search",
        "memories_cli.conversation_cmds:register",  # memory capture
        "memories_cli.extract_cmds:register",  # memory extract
        "memories_cli.tidy_cmds:register",  # memory summarize, prune
    )),
    Lazy("rag", "Ingest documents, search them and ask questions.", ("memories_cli.rag_cmds:register_rag",)),
    Lazy("sync", "Sync vaults between devices through a folder or an rclone remote, sealed end to end.", (
        "memories_cli.sync_cmds:sync_app",
    )),
    Lazy("grant", "Create, list and revoke grants that let AI tools reach one vault.", ("memories_cli.grant_cmds:register",)),
    Lazy("mcp", "Serve MCP over stdio for an AI client, limited to one grant.", ("memories_cli.grant_cmds:register",)),
    Lazy("daemon", "Start, stop, restart and inspect the memoriesd daemon.", ("memories_cli.vault_cmds:daemon_app",)),
    Lazy("config", "The settings of config.toml: `config show` prints every option with its value and source.", (
        "memories_cli.config_cmds:register",
    )),
    Lazy("doctor", "Check the set-up and print each problem with the command that fixes it.", ("memories_cli.doctor:register",)),
    Lazy("inject", "Install the Memories skill into AI clients' skill folders.", ("memories_cli.grant_cmds:register",)),
    Lazy("completion", "Print the shell completion script for bash, zsh or fish.", ("memories_cli.completion:register",)),
)

app = typer.Typer(
    name="memories",
    help="Memories: a local-first, encrypted personal knowledge vault. Global options: --home PATH, --json "
    "(also accepted after any command).",
    cls=root_class(COMMANDS),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    # Plain help: typer's rich help imports rich.markdown and markdown_it, ~180 ms of every --help.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _click_errors() -> tuple[tuple[type[Any], ...], tuple[type[Any], ...]]:
    """Typer raises its vendored click's exceptions (and plain click's in older versions)."""
    usage: list[type[Any]] = []
    no_args: list[type[Any]] = []
    for modname in ("typer._click.exceptions", "click.exceptions"):  # typer 0.28 vendors click as typer._click
        try:
            mod = __import__(modname, fromlist=["UsageError"])
        except ImportError:
            continue
        usage.append(mod.UsageError)
        for name in ("NoArgsIsHelpError", "NoArgsIsHelp"):
            if hasattr(mod, name):
                no_args.append(getattr(mod, name))
        break  # the vendored click is the only one typer raises (importing click too: ~6 ms)
    return tuple(usage), tuple(no_args)


_UsageErrors, _NoArgsIsHelp = _click_errors()


def _version(value: bool) -> None:
    if value:
        print(f"memories {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    home: Annotated[str | None, typer.Option("--home", metavar="PATH", help="Memories home (default: $MEMORIES_HOME, else ~/.memories).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout (errors as JSON on stderr).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    if home is not None:
        STATE.home_arg = home
    STATE.json = STATE.json or json_


def _split_json_flag(argv: list[str]) -> list[str]:
    """Accept --json anywhere before a `--` (the global flag, after the command too)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg == "--json":
            STATE.json = True
            continue
        out.append(arg)
    return out


def run(argv: list[str] | None = None) -> None:
    if os.environ.get("_MEMORIES_COMPLETE"):  # completion.COMPLETE_VAR: the shell asks (`memories completion SHELL`)
        from .completion import complete

        complete(app)
    args = _split_json_flag(list(sys.argv[1:] if argv is None else argv))
    try:
        code = app(args=args, prog_name="memories", standalone_mode=False)
    except MemoriesError as exc:
        try:
            fail(exc)
        except typer.Exit as ex:
            sys.exit(ex.exit_code)
    except _NoArgsIsHelp:
        sys.exit(2)  # typer has printed the help
    except _UsageErrors as exc:
        msg = " ".join(exc.format_message().split())
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        try:
            fail(UsageError(msg + hint))
        except typer.Exit as ex:
            sys.exit(ex.exit_code)
    except typer.Abort:
        sys.stderr.write("error[aborted]: interrupted\n")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("error[aborted]: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    if code == INTERRUPTED and not _interruption_said():  # typer turns Ctrl-C into a silent 130
        sys.stderr.write("error[aborted]: interrupted\n")
    sys.exit(code if isinstance(code, int) else 0)


INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


def _interruption_said() -> bool:
    """Whether a command said what its Ctrl-C left (memories_cli/progress.py ``interruptible``)."""
    progress = sys.modules.get("memories_cli.progress")
    return bool(getattr(progress, "said", False))


if __name__ == "__main__":
    run()
