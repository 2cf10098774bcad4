"""`memories`: the thin CLI. Parse → one request to memoriesd → render.

Heavy modules (numpy, onnxruntime, jieba, tokenizers) are never imported here: start-up is a feature.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memoriesd import __version__
from memoriesd.errors import MemoriesError, UsageError

from . import help as _help
from .completion import register as _register_completion
from .config_cmds import register as _register_config
from .conversation_cmds import register as _register_conversations
from .doctor import register as _register_doctor
from .extract_cmds import register as _register_extract
from .grant_cmds import register as _register_grants
from .memory_cmds import memory_app
from .rag_cmds import register as _register_rag
from .state import STATE, fail
from .status_cmds import register as _register_status
from .tidy_cmds import register as _register_tidy
from .vault_cmds import daemon_app, vault_app

app = typer.Typer(
    name="memories",
    help="Memories: a local-first, encrypted personal knowledge vault. Global options: --home PATH, --json "
    "(also accepted after any command).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    # Plain help: typer's rich help imports rich.markdown and markdown_it, ~180 ms of every --help.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(vault_app, name="vault")
app.add_typer(memory_app, name="memory")
app.add_typer(daemon_app, name="daemon")

# Every command group, registered explicitly: a broken import fails every command loudly instead of
# silently dropping `rag` or `grant` ("No such command").
_register_status(app)
_register_rag(app)
_register_grants(app)
_register_conversations(app)
_register_extract(app)
_register_tidy(app)
_register_doctor(app)
_register_config(app)
_register_completion(app)
# Usage `VAULT QUERY`, choices shown, whole summaries, --json listed on every command (memories_cli/help.py).
_help.apply(app)


def _click_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """Typer raises its vendored click's exceptions (and plain click's in older versions)."""
    usage: list[type[BaseException]] = []
    no_args: list[type[BaseException]] = []
    for modname in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = __import__(modname, fromlist=["UsageError"])
        except ImportError:
            continue
        usage.append(mod.UsageError)
        for name in ("NoArgsIsHelpError", "NoArgsIsHelp"):
            if hasattr(mod, name):
                no_args.append(getattr(mod, name))
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
    from .completion import complete, completing

    if completing():  # the shell asks for completions (`memories completion SHELL`)
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
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
