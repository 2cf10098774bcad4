"""Lazy commands: `memories X` imports and builds only X.

Start-up is most of a short command (issue 29: `rag search` took 128 ms against ~15 ms of work in
the daemon; every run imported all the command modules and let typer turn all ~50 command
signatures into click commands). Here:

- the top level is a table of :class:`Lazy` entries (:data:`memories_cli.main.COMMANDS`): a name,
  its one-line summary for `memories --help`, and where it lives. Its module is imported only when
  the command runs (or its own ``--help``, or a Tab completes under it);
- every group (top level and below) turns typer's ``CommandInfo``/``TyperInfo`` into click commands
  only when one is asked for by name: `memories rag search` builds `search`, not the other nine.

A broken module still fails loudly (``ModuleNotFoundError`` naming it) when its command runs, and
``tests/test_help.py`` loads every entry, so a bad import cannot hide until a user meets it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import typer
import typer.main as typer_main
from typer.models import CommandInfo, TyperInfo

from . import help as _help

Build = Callable[[], Any]

#: Called with every command or group as it is built (the shell completion attaches vault names).
ON_BUILD: list[Callable[[Any], None]] = []


@dataclass(frozen=True)
class Lazy:
    """A top-level command or group: ``memories NAME``.

    ``targets`` are ``"module:attribute"``: a ``typer.Typer`` (added as the group ``name``) or a
    ``register(app)`` function that registers ``name`` (and may add sub-commands to another
    module's group, as `rag_cmds.register_memory_search` adds `memory search`). ``summary`` is what
    `memories --help` shows without importing anything; a test holds it to the command's own.
    """

    name: str
    summary: str
    targets: tuple[str, ...]


class Commands(MutableMapping[str, Any]):
    """A group's sub-commands by name, each built on first use (click reads ``group.commands``)."""

    def __init__(self, builders: dict[str, Build], built: dict[str, Any] | None = None) -> None:
        self._builders = builders
        self._built: dict[str, Any] = dict(built or {})
        self._order = list(builders) + [n for n in self._built if n not in builders]

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            command = self._builders[name]()  # KeyError: no such command
            for hook in ON_BUILD:
                hook(command)
            self._built[name] = command
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._order:
            self._order.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._built.pop(name, None)
        self._builders.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def loaded(self, name: str) -> Any | None:
        """The command if it is built already, without building it."""
        return self._built.get(name)


class _Style:
    """How typer builds the commands (the root app's settings); a plain class: start-up counts."""

    __slots__ = ("pretty_exceptions_short", "rich_markup_mode", "suggest_commands")

    def __init__(
        self, *, pretty_exceptions_short: bool, rich_markup_mode: Any, suggest_commands: bool
    ) -> None:
        self.pretty_exceptions_short = pretty_exceptions_short
        self.rich_markup_mode = rich_markup_mode
        self.suggest_commands = suggest_commands


def _command_name(info: CommandInfo) -> str:
    return info.name or typer_main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]


def _build_command(info: CommandInfo, style: _Style) -> Any:
    return typer_main.get_command_from_info(
        info, pretty_exceptions_short=style.pretty_exceptions_short, rich_markup_mode=style.rich_markup_mode
    )


def _build_group(info: TyperInfo, style: _Style) -> Any:
    """typer's group for ``info`` (callback, options, help) with its sub-commands left to build."""
    sub = info.typer_instance
    assert sub is not None and info.name, "a lazy group needs a name and a typer.Typer"
    saved = sub.registered_commands, sub.registered_groups
    sub.registered_commands, sub.registered_groups = [], []
    try:
        group = typer_main.get_group_from_info(
            info,
            pretty_exceptions_short=style.pretty_exceptions_short,
            rich_markup_mode=style.rich_markup_mode,
            suggest_commands=style.suggest_commands,
        )
    finally:
        sub.registered_commands, sub.registered_groups = saved
    group.commands = Commands(builders_of(sub, style))
    return group


def builders_of(app: typer.Typer, style: _Style) -> dict[str, Build]:
    """How to build each command and group registered on ``app``, by name, in registration order."""
    out: dict[str, Build] = {}
    for cinfo in app.registered_commands:
        out[_command_name(cinfo)] = partial(_build_command, cinfo, style)
    for ginfo in app.registered_groups:
        out[str(ginfo.name)] = partial(_build_group, ginfo, style)
    return out


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(__import__(module, fromlist=[attr]), attr)  # __import__: seen by `python -X importtime`


class _Loader:
    """Runs each entry's targets once, on one scratch app shared by all entries of the process."""

    def __init__(self) -> None:
        self.app = typer.Typer()
        self._done: set[str] = set()

    def load(self, entry: Lazy) -> None:
        for target in entry.targets:
            if target in self._done:
                continue
            obj = _resolve(target)
            if isinstance(obj, typer.Typer):
                self.app.add_typer(obj, name=entry.name)
            else:
                obj(self.app)
            self._done.add(target)
        _help.apply(self.app)  # idempotent: classes are set once

    def build(self, entry: Lazy, style: _Style) -> Any:
        self.load(entry)
        builder = builders_of(self.app, style).get(entry.name)
        if builder is None:
            raise LookupError(f"{', '.join(entry.targets)} registered no command named {entry.name!r}")
        return builder()


_LOADER = _Loader()


class Root(_help.Group):
    """The `memories` group: the :class:`Lazy` table, plus anything registered on the app itself."""

    entries: tuple[Lazy, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        style = _Style(
            pretty_exceptions_short=True,
            rich_markup_mode=getattr(self, "rich_markup_mode", None),
            suggest_commands=getattr(self, "suggest_commands", True),
        )
        builders: dict[str, Build] = {e.name: partial(_LOADER.build, e, style) for e in self.entries}
        eager = dict(self.commands)  # registered on the app directly: built by typer already
        self.commands = Commands(builders, eager)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list from the table's summaries: `memories --help` imports no command module."""
        summaries = {e.name: e.summary for e in self.entries}
        commands = self.commands
        rows = []
        for name in self.list_commands(ctx):
            loaded = commands.loaded(name) if isinstance(commands, Commands) else commands.get(name)
            if loaded is None and name in summaries:
                rows.append((name, summaries[name]))
            elif loaded is not None and not loaded.hidden:
                rows.append((name, loaded.get_short_help_str()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def root_class(entries: tuple[Lazy, ...]) -> type[Root]:
    """The click group class of the `memories` app, serving ``entries``."""
    return type("MemoriesRoot", (Root,), {"entries": entries})


def load_all(entries: tuple[Lazy, ...]) -> dict[str, Any]:
    """Every entry built (tests, and a check that no command module is broken)."""
    style = _Style(pretty_exceptions_short=True, rich_markup_mode=None, suggest_commands=True)
    return {e.name: _LOADER.build(e, style) for e in entries}
