"""Progress of long commands (`rag ingest`, `rag index`, `rag model-install`) and what Ctrl-C says.

``--progress`` chooses how progress is shown, on stderr:

- ``auto`` (the default): a bar with the time left on a terminal; nothing in a pipe or a script,
  whose stderr stays for errors and the final line;
- ``json``: one JSON object per line, at most every 2 s and at the end
  (``{"progress": "embed", "done": 120, "total": 14747, "eta_seconds": 3400.0}``), for scripts
  that show their own progress;
- ``none``: nothing.

Ctrl-C while a command waits on the daemon ends the command with one line saying what became of
the work (:func:`interruptible`), exit code 130, no traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import typer

from .state import STATE

ProgressMode = Literal["auto", "json", "none"]
ProgressOpt = Annotated[
    ProgressMode,
    typer.Option(
        "--progress",
        help="Progress on stderr: auto (a bar on a terminal, nothing in a pipe), json (one JSON object per line) or none.",
    ),
]
#: Seconds between two JSON progress lines.
JSON_EVERY = 2.0
#: The exit code of a command ended by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130


class Progress:
    """A rich bar on a terminal (``auto``), JSON lines (``json``), or nothing."""

    def __init__(self, label: str, mode: str = "auto") -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.mode = mode
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._last_line = 0.0
        self._last: tuple[str, int] = ("", -1)

    @property
    def lines(self) -> bool:
        """Whether progress is written as JSON lines."""
        return self.mode == "json"

    def __enter__(self) -> Progress:
        if self.mode == "auto" and self.tty and not STATE.json:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def update(self, name: str, done: int, total: int, eta_seconds: float | None = None) -> None:
        if self._bar is not None:
            task = self._tasks.get(name)
            if task is None:
                task = self._tasks[name] = self._bar.add_task(name, total=total)
            self._bar.update(task, completed=done, total=total)
            return
        if not self.lines:
            return
        now = time.monotonic()
        if (now - self._last_line >= JSON_EVERY or done >= total) and (name, done) != self._last:
            self._last_line = now
            self._last = (name, done)
            line: dict[str, Any] = {"progress": name, "done": done, "total": total}
            if eta_seconds is not None:
                line["eta_seconds"] = eta_seconds
            sys.stderr.write(json.dumps(line, ensure_ascii=False) + "\n")
            sys.stderr.flush()

    def status(self, text: str) -> None:
        """A rare status line (a file verified, a download resumed): shown unless ``none``."""
        if self.mode == "json":
            sys.stderr.write(json.dumps({"progress": self.label, "status": text}, ensure_ascii=False) + "\n")
        elif self.mode == "auto" and self._bar is None and not STATE.json:
            sys.stderr.write(text + "\n")


#: Set once :func:`interrupted_line` has written its line (memories_cli/main.py then adds none).
said = False


def interrupted_line(what: str) -> None:
    """The one line Ctrl-C leaves on stderr (JSON with ``--json``)."""
    global said
    said = True
    if STATE.json:
        sys.stderr.write(
            json.dumps({"error": {"code": "interrupted", "message": what}}, ensure_ascii=False) + "\n"
        )
    else:
        sys.stderr.write(f"interrupted: {what}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def interruptible(what: str, bar: Progress | None = None) -> Iterator[None]:
    """Ctrl-C inside: the bar stops, ``interrupted: <what>`` on stderr, exit code 130, no traceback.

    ``what`` says what became of the work (the daemon cancels a request whose client went away at its
    next check; what it finished is kept).
    """
    try:
        yield
    except KeyboardInterrupt:
        if bar is not None:
            bar.__exit__(None, None, None)  # the bar's last state stays; the line goes under it
        interrupted_line(what)
        raise typer.Exit(INTERRUPTED) from None


__all__ = ["INTERRUPTED", "Progress", "ProgressMode", "ProgressOpt", "interrupted_line", "interruptible"]
