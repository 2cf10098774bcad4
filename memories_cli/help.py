"""Help that teaches: how every `memories` command presents itself in `--help`.

Typer's defaults print usage lines as ``{vault} {query}``, option values as ``<str>``, cut command
summaries mid-sentence in the command lists ("Ingest documents as encrypted knowledge...") and hide
the global ``--json`` from subcommands. :func:`apply` gives every command and group of the app the
classes below, once, before the click command tree is built:

- usage lines name arguments in capitals: ``memories rag search [OPTIONS] VAULT QUERY``;
- an option's value is shown by what it takes: ``--mode [bm25|vector|hybrid]`` for a choice
  (``Literal`` in the signature), ``N`` for a whole number, ``NUMBER``, ``PATH``, ``TEXT`` otherwise,
  unless the option names its own metavar (``--since DATE``);
- the command lists show each command's first sentence whole (wrapped, never cut);
- every command but ``mcp`` lists ``--json``. The flag itself is taken anywhere before ``--`` by
  :func:`memories_cli.main.run` (before or after the command); here it is documented, and honoured
  when the app is invoked without ``run``.

Nothing here changes which values an option accepts.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from .state import STATE

#: Commands whose output is not ours to shape (`mcp` speaks MCP on stdout): no ``--json`` listed.
NO_JSON = frozenset({"mcp", "completion"})

JSON_HELP = "Machine-readable JSON on stdout (errors as JSON on stderr); also accepted before the command."

_TYPE_METAVARS = {"int": "N", "int range": "N", "float": "NUMBER", "float range": "NUMBER", "path": "PATH", "str": "TEXT"}
_SENTENCE_END = re.compile(r"(?<!\.)(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)")


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph, whole (a summary for the command lists)."""
    paragraph = " ".join(text.split("\n\n", 1)[0].split()).removeprefix("\b").strip()
    m = _SENTENCE_END.search(paragraph)
    return paragraph[: m.end()] if m else paragraph


def _metavar(param: Any) -> str | None:
    """What the help shows for a parameter's value (None: leave it as typer has it)."""
    if param.param_type_name == "argument":
        name = str(param.metavar or param.name or "").upper()
        return name + ("..." if param.nargs != 1 else "")
    if getattr(param, "is_flag", False) or getattr(param, "count", False) or param.metavar is not None:
        return None
    choices = getattr(param.type, "choices", None)
    if choices:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in choices) + "]"
    return _TYPE_METAVARS.get(param.type.name, "TEXT")


def _label_params(params: list[Any]) -> None:
    for param in params:
        metavar = _metavar(param)
        if metavar is not None:
            param.metavar = metavar


def _json_flag(ctx: Any, _param: Any, value: bool) -> None:
    if value:
        STATE.json = True


def _json_option() -> Any:
    from typer.core import TyperOption

    return TyperOption(param_decls=["--json"], is_flag=True, expose_value=False, callback=_json_flag, help=JSON_HELP)


class Command(TyperCommand):
    """A `memories` command: capitalised usage, choices shown, ``--json`` listed, whole summary."""

    json_flag = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _label_params(self.params)
        if self.json_flag and not any("--json" in getattr(p, "opts", ()) for p in self.params):
            self.params.append(_json_option())

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = str(param.metavar)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self.short_help or self.help or "")


class PlainCommand(Command):
    """A command whose stdout is a protocol (`mcp`): no ``--json``."""

    json_flag = False


class Group(TyperGroup):
    """A `memories` command group: its options labelled, its commands summarised whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _label_params(self.params)

    def list_commands(self, ctx: Any) -> list[str]:
        """The names in registration order, without building the commands (memories_cli/lazy.py)."""
        return list(self.commands)

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self.short_help or self.help or "")


def apply(app: typer.Typer) -> None:
    """Give every command and group of ``app`` (recursively) the classes above, unless one names its own."""
    if not isinstance(app.info.cls, type) or app.info.cls is TyperGroup:
        app.info.cls = Group
    for info in app.registered_commands:
        if info.cls is None or info.cls is TyperCommand:  # typer's default: no class of its own
            name = info.name or (info.callback.__name__ if info.callback else "")
            info.cls = PlainCommand if name in NO_JSON else Command
    for group in app.registered_groups:
        if group.typer_instance is not None:
            apply(group.typer_instance)
