"""Global CLI state (home, --json) and the one place output and errors are rendered."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from memoriesd.errors import ConfirmationRequired, MemoriesError, UsageError
from memoriesd.home import Home, resolve_home


@dataclass
class State:
    home_arg: str | None = None
    json: bool = False
    color: str = "auto"  # --color auto|always|never (use_color)

    @property
    def home(self) -> Home:
        return resolve_home(self.home_arg)


STATE = State()


def client(*, autostart: bool = True) -> Any:
    """A daemon client whose reply notices are rendered on stderr (the one place they are)."""
    from .client import Client

    return Client(STATE.home, autostart=autostart, on_notice=daemon_notice)


def call(method: str, params: dict[str, Any] | None = None, *, progress: Callable[[dict[str, Any]], None] | None = None) -> Any:
    return client().call(method, params, progress=progress)


_SHOWN_NOTICES: set[str] = set()


def daemon_notice(text: str) -> None:
    """A notice the daemon attaches to every reply (e.g. a restart is pending): once per command."""
    if text not in _SHOWN_NOTICES:
        _SHOWN_NOTICES.add(text)
        notice(f"notice: {text}")


# C0 controls, DEL and C1 controls (ESC and CSI among them): a title, a body or an error message must
# never drive the terminal (clear it, retitle it, hide text). Line breaks and tabs survive only in
# multi-line text, and a carriage return only before a line feed (CRLF).
_CONTROLS_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROLS_MULTILINE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")


def _visible(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def safe_text(text: str, *, multiline: bool = False) -> str:
    """``text`` for a terminal: control characters become visible escapes (ESC shows as ``\\x1b``).

    Every human (non-JSON) renderer passes user data through this; ``--json`` keeps the exact text.
    ``multiline`` keeps line feeds, tabs and CRLF line ends (bodies, answers).
    """
    return (_CONTROLS_MULTILINE if multiline else _CONTROLS_ONE_LINE).sub(_visible, text)


def echo(text: str = "") -> None:
    """A line of (possibly multi-line) text on stdout, control characters neutralised."""
    sys.stdout.write(safe_text(text, multiline=True) + "\n")


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def report(obj: Any, human: str) -> None:
    """The result of a command: JSON on stdout with --json, else a one-line notice on stderr."""
    if STATE.json:
        emit_json(obj)
    else:
        notice(human)


def use_color(choice: str | None = None) -> bool:
    """Colour and bold for stdout: ``--color always|never``, else (auto) a terminal without ``NO_COLOR``."""
    choice = choice or STATE.color
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return sys.stdout.isatty()


def notice(text: str) -> None:
    """Notices go to stderr (stdout stays machine-readable)."""
    sys.stderr.write(safe_text(text, multiline=True) + "\n")


def console() -> Any:
    """A rich console for stdout: colour only where :func:`use_color` allows it."""
    from rich.console import Console

    color = use_color()
    return Console(highlight=False, soft_wrap=False, no_color=not color, color_system="auto" if color else None)


#: Table columns of free text (titles, snippets, labels): the only ones a table cuts or wraps. Ids,
#: paths, scopes, kinds, numbers and dates are always whole, on one line.
FREE_TEXT_COLUMNS = frozenset({"TITLE", "TEXT", "LABEL", "SNIPPET", "MATCH", "SUMMARY", "DESCRIPTION"})
#: The narrowest a free-text column is cut to in a pipe before the line grows past the width.
FREE_TEXT_MIN = 16


def table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """A table: boxed on a terminal, plain aligned columns in a pipe (no box drawing).

    Only :data:`FREE_TEXT_COLUMNS` give way to the width: wrapped on a terminal; in a pipe (or a
    terminal too narrow for the other columns whole) cut to one line with "…" (one row per line,
    for grep and cut), the line longer than the width rather than an id broken in two.
    """
    import shutil

    from rich.cells import cell_len

    cells = [["" if v is None else safe_text(str(v), multiline=True) for v in r] for r in rows]
    natural = [max([cell_len(c)] + [cell_len(line) for r in cells for line in r[i].splitlines() or [""]]) for i, c in enumerate(columns)]
    boxed = STATE.color != "never"
    least = sum(min(w, FREE_TEXT_MIN) if c in FREE_TEXT_COLUMNS else w for c, w in zip(columns, natural, strict=True))
    least += 3 * len(columns) + 1 if boxed else 2 * (len(columns) - 1)
    if not sys.stdout.isatty() or least > shutil.get_terminal_size().columns:  # no room for a box: one line a row
        _plain_table(columns, cells, title)
        return
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(
        title=Text(safe_text(title)) if title else None,
        show_lines=False,
        box=box.SQUARE if boxed else None,
        show_edge=boxed,
        pad_edge=boxed,
        header_style="bold" if boxed else "",
    )
    for c, w in zip(columns, natural, strict=True):
        if c in FREE_TEXT_COLUMNS:
            t.add_column(Text(c), overflow="fold", min_width=min(w, FREE_TEXT_MIN))
        else:
            t.add_column(Text(c), no_wrap=True, min_width=w)
    for r in cells:  # Text(): user data is never read as rich markup; safe_text: nor as terminal controls
        t.add_row(*[Text(v) for v in r])
    console().print(t)


def _plain_table(columns: list[str], cells: list[list[str]], title: str | None) -> None:
    """Aligned columns (a pipe, a narrow terminal): a row a line, only free text cut to fit the width."""
    import shutil

    from rich.cells import cell_len, set_cell_size

    flat = [[" ".join(v.split()) for v in r] for r in cells]
    widths = [max([cell_len(c)] + [cell_len(r[i]) for r in flat]) for i, c in enumerate(columns)]
    room = max(40, shutil.get_terminal_size((100, 24)).columns) - 2 * (len(columns) - 1)
    free = sorted((i for i, c in enumerate(columns) if c in FREE_TEXT_COLUMNS), key=lambda i: -widths[i])
    for i in free:  # the widest free column gives way first, never under FREE_TEXT_MIN
        excess = sum(widths) - room
        if excess <= 0:
            break
        widths[i] = max(min(widths[i], FREE_TEXT_MIN), widths[i] - excess)
    out = sys.stdout
    if title:
        out.write(safe_text(title) + "\n")
    for r in [columns, *flat]:
        parts = []
        for i, v in enumerate(r):
            if cell_len(v) > widths[i]:
                v = str(set_cell_size(v, widths[i] - 1)).rstrip() + "\u2026"
            parts.append(v if i == len(r) - 1 else v + " " * (widths[i] - cell_len(v)))
        out.write("  ".join(parts).rstrip() + "\n")


def fail(exc: MemoriesError) -> None:
    """Render an error in one line on stderr and exit with its code."""
    from memoriesd.errors import exit_code_for

    if STATE.json:
        sys.stderr.write(json.dumps({"error": exc.to_dict()}, ensure_ascii=False) + "\n")
    else:
        sys.stderr.write(f"error[{exc.code}]: {safe_text(exc.message)}\n")
    raise typer.Exit(exit_code_for(exc.code))


def read_secret_lines(stdin: bool, path: Path | None, count: int) -> list[str]:
    """Read ``count`` passphrase lines from stdin or a file (trailing newline stripped)."""
    if stdin and path is not None:
        raise UsageError("use either --passphrase-stdin or --passphrase-file, not both")
    if path is not None:
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the passphrase file {path} ({exc.strerror})") from exc
        lines = text.splitlines()
    else:
        lines = [sys.stdin.readline().rstrip("\r\n") for _ in range(count)]
    if len(lines) < count or any(not ln for ln in lines[:count]):
        what = "a passphrase line" if count == 1 else f"{count} passphrase lines (old, then new)"
        raise UsageError(f"expected {what}, got fewer or an empty one")
    return lines[:count]


def prompt_secret(prompt: str, confirm: bool = False) -> str:
    import getpass

    if not sys.stdin.isatty():
        raise UsageError("no terminal to ask for the passphrase: pass --passphrase-stdin or --passphrase-file")
    first = getpass.getpass(prompt)
    if confirm:
        second = getpass.getpass("Repeat the passphrase: ")
        if first != second:
            raise UsageError("the two passphrases differ: try again")
    if not first:
        raise UsageError("the passphrase is empty: choose a passphrase")
    return first


def confirm(question: str, *, refused: str) -> bool:
    """Ask a yes/no question on the terminal (default no).

    Without a terminal on stdin nobody can answer: ``confirmation_required`` at once (``refused`` says
    what would happen and that --yes does it), never a prompt that reads a pipe or hangs.
    """
    if not sys.stdin.isatty():
        raise ConfirmationRequired(refused)
    return bool(typer.confirm(question, default=False))


def cli_command(*args: str) -> str:
    """A `memories ...` command line to show the user, with --home when this run was given one."""
    import shlex

    prefix = ["memories"]
    if STATE.home_arg:
        prefix += ["--home", str(STATE.home.root)]
    return shlex.join([*prefix, *args])


def fmt_time(ts: float | None) -> str:
    if not ts:
        return ""
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
