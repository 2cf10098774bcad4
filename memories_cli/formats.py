"""`--format text|json|jsonl|csv|md|files`: the one place every listing command's output is written.

A command builds a :class:`Listing` (its ``--json`` document, the items it lists, the CSV columns,
its text rendering) and hands it to :func:`emit`:

- ``text``: for people (``memories_cli.render``): blocks, tables, summaries; notices on stderr;
- ``json``: the documented JSON document (``--json`` is its short form);
- ``jsonl``: one JSON object per item and line, for streaming;
- ``csv``: a header row, then one row per item (stdlib :mod:`csv`; lists joined with ``;``, objects as JSON,
  times as ISO 8601 with the local offset, ``2026-03-01T14:05:09+01:00``);
- ``md``: a Markdown list, files as links;
- ``files``: the distinct source files of the items, one absolute path per line, best first (for
  ``xargs``, editors, ``fzf``); items without a file are left out.

Machine formats keep the exact text (like JSON); ``text`` and ``md`` neutralise control characters.
Notices go to stderr in every format but ``json``, where they are part of the document.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from memoriesd.errors import UsageError

from .state import STATE, emit_json, notice, safe_text

Format = Literal["text", "json", "jsonl", "csv", "md", "files"]
#: Listings whose items have no source file (vaults, records, revisions): no ``files``.
PlainFormat = Literal["text", "json", "jsonl", "csv", "md"]

_FORMAT_HELP = "Output: text for people; json (as --json), jsonl (one object per line), csv (with a header) or md (a Markdown list) for scripts"
FormatOpt = Annotated[Format | None, typer.Option("--format", help=_FORMAT_HELP + "; files: only the distinct source file paths.")]
PlainFormatOpt = Annotated[PlainFormat | None, typer.Option("--format", help=_FORMAT_HELP + ".")]
ColorOpt = Annotated[
    Literal["auto", "always", "never"],
    typer.Option("--color", help="Colour and bold in text output: auto (a terminal, unless NO_COLOR is set), always or never."),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Text output also shows record ids, revisions, fingerprints and byte ranges.")]


def chosen(fmt: str | None, color: str = "auto") -> str:
    """The format asked for (``--json`` is ``--format json``); ``--color`` is kept for the renderers."""
    STATE.color = color
    if fmt is None:
        return "json" if STATE.json else "text"
    if STATE.json and fmt != "json":
        raise UsageError(f"--json and --format {fmt} ask for two formats: give one of them")
    return fmt


@dataclass
class Listing:
    """One command's output in every format."""

    document: dict[str, Any]  # the --json document (keys as documented)
    items: list[dict[str, Any]]  # what is listed: jsonl lines, csv rows, md items, files
    columns: Sequence[str]  # the csv header: item keys
    text: Callable[[], None]  # the text rendering (it prints its own notices)
    md_item: Callable[[dict[str, Any]], str] | None = None  # one Markdown list item (default: title and where)
    md_head: str = ""  # Markdown before the list (rag ask: the answer)
    notices: list[str] = field(default_factory=list)


def emit(fmt: str, listing: Listing) -> None:
    if fmt == "json":
        emit_json(listing.document)
        return
    if fmt == "text":
        listing.text()
        return
    for n in listing.notices:
        notice(n)
    out = sys.stdout
    if fmt == "jsonl":
        for item in listing.items:
            out.write(json.dumps(item, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        write_csv(listing.items, listing.columns)
    elif fmt == "md":
        if listing.md_head:
            out.write(safe_text(listing.md_head, multiline=True).rstrip("\n") + "\n\n")
        render = listing.md_item or md_item
        for item in listing.items:
            out.write(render(item) + "\n")
    elif fmt == "files":
        for path in source_files(listing.items):
            out.write(path + "\n")
    else:  # pragma: no cover - typer refuses other values
        raise UsageError(f"unknown format {fmt}")


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list)) for v in value):
        return ";".join(str(v) for v in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


#: Columns that hold a time (seconds since the epoch in JSON): ISO 8601 in CSV.
DATE_COLUMNS = frozenset({"created", "updated", "expires", "last_used", "last_recall", "last_push", "last_pull", "last_sync"})


def iso_time(ts: float) -> str:
    """``2026-03-01T14:05:09+01:00``: local time with its offset, to the second (spreadsheets read it)."""
    import datetime as dt

    return dt.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def write_csv(items: list[dict[str, Any]], columns: Sequence[str]) -> None:
    import csv

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(columns)
    for item in items:
        row = []
        for c in columns:
            v = item.get(c)
            dated = c in DATE_COLUMNS and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            row.append(iso_time(float(v)) if dated else csv_cell(v))  # type: ignore[arg-type]
        w.writerow(row)


def source_files(items: list[dict[str, Any]]) -> list[str]:
    """The distinct ``source`` paths of ``items``, in their order."""
    return list(dict.fromkeys(str(i["source"]) for i in items if i.get("source")))


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>#|"})


def md_escape(text: str) -> str:
    """Text for a Markdown line: no control characters, no line breaks, no markup."""
    return safe_text(" ".join(text.split())).translate(_MD_SPECIAL)


def md_link(source: str, line: int | None = None) -> str:
    """``[~/notes/a.md:12](file:///home/me/notes/a.md)``: the path shown, the file linked."""
    from .render import location

    try:
        uri = Path(source).as_uri()
    except ValueError:  # not an absolute path
        return f"`{safe_text(location(source, line))}`"
    return f"[{md_escape(location(source, line))}]({uri})"


def md_item(item: dict[str, Any], *, label: str = "", title_key: str = "title", extra: str = "", quote: str = "") -> str:
    """``- **[S1] Title** · [~/a.md:3](file:///…/a.md) · 87%`` and the passage quoted under it."""
    head = " ".join(p for p in (f"[{label}]" if label else "", md_escape(str(item.get(title_key) or "")) or "(untitled)") if p)
    parts = [f"- **{head}**"]
    if item.get("source"):
        parts.append(md_link(str(item["source"]), item.get("line")))
    elif item.get("record_id") or item.get("id"):
        parts.append(f"`{md_escape(str(item.get('record_id') or item.get('id')))}`")
    if extra:
        parts.append(extra)
    line = " \u00b7 ".join(parts)
    if quote:
        line += "\n  > " + md_escape(quote)
    return line


__all__ = [
    "ColorOpt",
    "Format",
    "FormatOpt",
    "Listing",
    "PlainFormat",
    "PlainFormatOpt",
    "VerboseOpt",
    "chosen",
    "emit",
    "md_item",
    "md_link",
    "source_files",
    "write_csv",
]
