"""`memories memory capture`: hand a finished conversation to the vault (parsing is the daemon's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError
from memoriesd.server.protocol import DEFAULT_MAX_FRAME

from .state import STATE, call, emit_json, notice, safe_text, table

FORMATS = ("auto", "jsonl", "markdown", "locomo")  # memoriesd.conversations.transcripts.FORMATS
#: Room in a request frame for everything but the text (vault, options, JSON framing).
_FRAME_ROOM = 64 * 1024
MAX_TEXT_BYTES = DEFAULT_MAX_FRAME - _FRAME_ROOM

CAPTURE_HELP = """Store a finished conversation, one record per session.

Each session becomes one record (kind conversation) with its turns
(speaker, text, time when known), speakers and session date, searchable by who and when.

Formats (--format auto detects them): jsonl, chat messages one per line as {"role": ..., "content": ...}
(string or list of text parts, optional "timestamp"; a Claude Code session transcript is read too, keeping
only what user and assistant wrote); markdown, "Speaker: text" lines, a turn going on until the next
"Name:" line (optional "# Title" and front matter date:); locomo, the LoCoMo JSON (one record per session,
with its date).

Capturing the same session again changes nothing; a session that went on becomes a new revision of its
record. Then facts are extracted from it unless --no-extract (see `memories memory extract`).

Examples:

\b
  memories memory capture personal ~/.claude/projects/-home-me-app/SESSION.jsonl
  memories memory capture personal locomo-26.json --format locomo --no-extract
  cat call-notes.md | memories memory capture personal - --date 2024-05-08
"""


def _shown(path: str) -> str:
    return safe_text(os.fsencode(path).decode("utf-8", "backslashreplace"))


def read_conversation(source: str) -> str:
    """The text of FILE (a regular file) or of stdin for ``-``: UTF-8, within a request frame."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        shown = "stdin"
    else:
        from .memory_cmds import read_regular_file

        path = Path(source).expanduser()
        shown = _shown(source)
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise UsageError(f"cannot read {shown} ({exc.strerror}): name an existing file, or - for stdin") from exc
        if size > MAX_TEXT_BYTES:
            raise _too_big(shown, size)
        data = read_regular_file(path, MAX_TEXT_BYTES)
    if len(data) > MAX_TEXT_BYTES:
        raise _too_big(shown, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shown} is not UTF-8 text (byte {exc.start:,}): convert it first, e.g. with iconv -t UTF-8") from None
    if len(json.dumps(text, ensure_ascii=False).encode("utf-8")) > MAX_TEXT_BYTES:  # escapes grow JSON
        raise _too_big(shown, len(data), escaped=True)
    return text


def _too_big(shown: str, size: int, *, escaped: bool = False) -> UsageError:
    limit = MAX_TEXT_BYTES / 2**20
    how = " once escaped for the request" if escaped else ""
    return UsageError(
        f"{shown} is {size / 2**20:.1f} MiB{how}, over the {limit:.1f} MiB one capture can send: "
        "split it into smaller files (e.g. one per session)"
    )


def capture(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    source: Annotated[str, typer.Argument(metavar="FILE|-", help="The conversation file, or - to read it from stdin.")],
    format_: Annotated[str, typer.Option("--format", metavar="[auto|jsonl|markdown|locomo]", help="The file's format (auto: detected).")] = "auto",
    title: Annotated[str | None, typer.Option("--title", help="Title (default: from the file, else the speakers and date; LoCoMo: suffixed with the session).")] = None,
    date: Annotated[str | None, typer.Option("--date", help="Session date, ISO (2024-05-08 or 2024-05-08T14:30); default: from the file.")] = None,
    session_id: Annotated[str | None, typer.Option("--session-id", help="Session id: a capture with the same id revises that record (default: from the file, else its first turn and date).")] = None,
    no_extract: Annotated[bool, typer.Option("--no-extract", help="Do not extract facts after capture.")] = False,
) -> None:
    if format_ not in FORMATS:
        raise UsageError(f"--format takes {', '.join(FORMATS)}")
    params: dict[str, Any] = {"vault": vault, "text": read_conversation(source), "format": format_, "extract": not no_extract}
    for key, value in (("title", title), ("date", date), ("session_id", session_id)):
        if value is not None:
            params[key] = value
    out = call("memory.capture", params)
    if STATE.json:
        emit_json(out)
        return
    recs = out["records"]
    counts = {s: sum(1 for r in recs if r["status"] == s) for s in ("created", "revised", "unchanged")}
    table(
        ["ID", "REV", "STATUS", "TURNS", "DATE", "TITLE"],
        [[r["id"], r["revision"], r["status"], r["turns"], r.get("date") or "", r["title"]] for r in recs],
    )
    done = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    notice(f"Captured {len(recs)} session{'s' if len(recs) != 1 else ''} ({out['format']}): {done}.")
    extraction = out.get("extraction")
    if isinstance(extraction, dict) and extraction.get("path"):
        from .extract_cmds import render

        render(extraction)  # the extracted facts, the notices (why a path ran, or none), a count line


capture.__doc__ = CAPTURE_HELP


def titled(result: dict[str, Any]) -> str:
    """A search result's title, with a conversation's session date and speakers:
    "Caroline and Melanie, session 1 (8 May 2023, 1:56 pm; Caroline, Melanie)"."""
    title = str(result.get("title") or "")
    conv = result.get("conversation")
    if not isinstance(conv, dict):
        return title
    about = "; ".join(p for p in (str(conv.get("when") or conv.get("date") or ""), ", ".join(map(str, conv.get("speakers") or []))) if p)
    return f"{title} ({about})" if about and title else (about or title)


def register(app: typer.Typer) -> None:
    """`memory capture` in the `memory` group."""
    from .memory_cmds import memory_app

    memory_app.command("capture")(capture)


__all__ = ["MAX_TEXT_BYTES", "read_conversation", "register", "titled"]
