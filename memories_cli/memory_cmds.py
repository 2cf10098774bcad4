"""`memories memory ...`: add, read, list, update, delete and search records; remember facts (forget: forget_cmds.py)."""

from __future__ import annotations

import base64
import os
import stat
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from memoriesd.errors import UsageError

from .formats import ColorOpt, FormatOpt, Listing, PlainFormatOpt, chosen, emit, md_item
from .render import plain
from .state import STATE, call, emit_json, fmt_time, notice, report, safe_text, table

memory_app = typer.Typer(help="Keep notes, credentials and files in a vault.", no_args_is_help=True, rich_markup_mode=None)

MAX_FILE = 6 * 1024 * 1024


def _special_kind(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO (named pipe)"...), or None for a regular file."""
    from memoriesd.text.files import non_regular_kind

    return non_regular_kind(mode)


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else :class:`UsageError` in one line.

    FIFOs, devices, sockets and directories are refused before they are opened (reading a FIFO
    would wait forever for a writer); the descriptor is opened non-blocking and checked again, and
    at most ``limit + 1`` bytes are read.
    """
    shown = safe_text(os.fsencode(path).decode("utf-8", "backslashreplace"))
    too_big = UsageError(f"{shown} is larger than {limit // (1024 * 1024)} MiB: file resources are limited to that")
    try:
        kind = _special_kind(os.stat(path).st_mode)
        if kind is not None:
            raise UsageError(f"{shown} is {kind}, not a regular file: name a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{shown} is {_special_kind(st.st_mode)}, not a regular file: name a regular file")
            if st.st_size > limit:
                raise too_big
            chunks: list[bytes] = []
            left = limit + 1
            while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
                chunks.append(block)
                left -= len(block)
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"cannot read {shown} ({exc.strerror})") from exc
    data = b"".join(chunks)
    if len(data) > limit:
        raise too_big
    return data


def _text_arg(text: str | None) -> str | None:
    if text == "-":
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError("stdin is not UTF-8 text: convert it first, or add it with --kind file --file") from exc
    return text


@memory_app.command("add")
def add(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    text: Annotated[str | None, typer.Argument(help="The text, or - to read it from stdin.")] = None,
    title: Annotated[str, typer.Option("--title", help="Title.")] = "",
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag (repeatable).")] = None,
    private: Annotated[bool, typer.Option("--private", help="Never indexed, searched, or sent anywhere.")] = False,
    kind: Annotated[str, typer.Option("--kind", metavar="[memory|credential|file]", help="What the record holds (a file: with --file).")] = "memory",
    file: Annotated[Path | None, typer.Option("--file", help="With --kind file: the file to seal (any bytes).")] = None,
) -> None:
    """Add a record to a vault.

    Prints its id alone on the last line. For Markdown and text files, see `memories rag ingest`.
    """
    if kind not in ("memory", "credential", "file"):
        raise UsageError("--kind takes memory, credential or file")
    params: dict[str, Any] = {"vault": vault, "kind": kind, "title": title, "tags": tag or [], "private": private}
    if kind == "file":
        if file is None:
            raise UsageError("--kind file needs --file PATH")
        data = read_regular_file(file, MAX_FILE)
        params["data"] = base64.b64encode(data).decode("ascii")
        params["filename"] = os.fsencode(file.name).decode("utf-8", "backslashreplace")  # a name that is not UTF-8
    else:
        if file is not None:
            raise UsageError("--file goes with --kind file; for text documents use `memories rag ingest`")
        body = _text_arg(text)
        if body is None:
            raise UsageError("give the text as an argument, or - to read it from stdin")
        params["body"] = body
    out = call("memory.add", params)
    if STATE.json:
        emit_json(out)
    else:
        print(out["id"])


@memory_app.command("read")
def read(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    record_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="Record id (or give --path).")] = None,
    revision: Annotated[int | None, typer.Option("--revision", help="An older revision.")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="For a file resource: write its bytes here.")] = None,
    path: Annotated[str | None, typer.Option("--path", help="Instead of an ID: the card ingested from this file (e.g. notes/chsh.md; the end of its path is enough).")] = None,
) -> None:
    """Show a record (by its id, or the card ingested from a file with --path); --output writes it out."""
    if (record_id is None) == (path is None):
        raise UsageError("give a record ID or --path FILE (the card ingested from that file), not both")
    params: dict[str, Any] = {"vault": vault, "with_data": output is not None}
    if record_id is not None:
        params["id"] = record_id
    else:
        assert path is not None
        params.update({"path": path, "absolute": os.path.realpath(os.path.expanduser(path))})
    if revision is not None:
        params["revision"] = revision
    out = call("memory.read", params)
    if output is not None:
        if out["kind"] != "file":
            output.write_text(out["body"], "utf-8")
        else:
            output.write_bytes(base64.b64decode(out.pop("data", "")))
        notice(f"Wrote {output}.")
    out.pop("data", None)
    if STATE.json:
        emit_json({k: out[k] for k in ("id", "revision", "kind", "title", "body", "tags", "private", "created", "updated")} | {"meta": out.get("meta", {})})
        return
    if output is None:
        tags = ", ".join(out["tags"])
        notice(f"# {safe_text(out['title']) or '(untitled)'}  [{out['kind']}, revision {out['revision']}{', private' if out['private'] else ''}{', tags: ' + tags if tags else ''}]")
        if out["kind"] == "file":
            notice(f"(file resource {safe_text(out.get('filename', ''))}, {out.get('size', 0):,} bytes: write it out with --output F)")
        else:
            body = safe_text(out["body"], multiline=True)  # --json keeps the exact text
            sys.stdout.write(body + ("" if body.endswith("\n") else "\n"))


@memory_app.command("history")
def history(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    record_id: Annotated[str, typer.Argument(metavar="ID", help="Record id.")],
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """List a record's revisions.

    Old revisions stay readable until `memories vault compact` removes them. In a synced vault,
    edits made on two devices at once are both kept: one is current, the other is listed as a
    [conflict] revision; editing the record again resolves it.
    """
    fmt = chosen(format_, color)
    out = call("memory.history", {"vault": vault, "id": record_id})
    fact = any("text" in r for r in out["revisions"])  # a fact: what it said at each revision
    what = "text" if fact else "title"

    def note(r: dict[str, Any]) -> str:
        """Sync's marks: a conflict revision (a concurrent edit that did not win, kept), and a head no
        later edit resolved (`memories sync status` lists such records)."""
        marks = [m for m, on in (("conflict", r.get("conflict")), ("unresolved", r.get("unresolved"))) if on]
        return f" [{', '.join(marks)}]" if marks else ""

    def text() -> None:
        table(
            ["REVISION", "UPDATED", what.upper()],
            [[r["revision"], fmt_time(r["updated"]), ("(deleted)" if r["deleted"] else r.get(what, "")) + note(r)] for r in out["revisions"]],
        )

    emit(fmt, Listing(
        document=out,
        items=[{"id": out["id"], **r} for r in out["revisions"]],
        columns=("id", "revision", "updated", "deleted", what),
        text=text,
        md_item=lambda r: f"- revision {r['revision']}, {fmt_time(r['updated'])}: " + ("(deleted)" if r["deleted"] else md_item(r, title_key=what)[2:]),
    ))


ListKind = Literal["memory", "card", "fact", "conversation", "credential", "file"]  # memoriesd.vault.records.KINDS
FactCategory = Literal["profile", "preference", "decision", "pattern", "fact"]  # memoriesd.memory.facts.CATEGORIES


@memory_app.command(
    "list",
    epilog="""Examples:

\b
  memories memory list notes                         # the 50 newest records
  memories memory list notes --limit 50 --offset 50  # the next 50
  memories memory list notes --kind card --tag travel --since 2024-01-01""",
)
def list_(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    kind: Annotated[ListKind | None, typer.Option("--kind", help="Only records of this kind (fact: the current facts with their category, key and recalls).")] = None,
    category: Annotated[FactCategory | None, typer.Option("--category", help="With --kind fact: only this category.")] = None,
    tag: Annotated[str | None, typer.Option("--tag", metavar="TAG", help="Only records with this tag (case-insensitive).")] = None,
    since: Annotated[str | None, typer.Option("--since", metavar="DATE", help="Only records dated on or after this ISO date (YYYY-MM-DD), as for `rag search --since`.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many records (1-100000).")] = 50,
    offset: Annotated[int, typer.Option("--offset", help="Skip this many records first (the next page: --offset 50).")] = 0,
    format_: FormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """List records, newest first, a page at a time.

    50 records by default, then the total ("showing 1–50 of 5,183 records"); --offset gives the next
    pages. --kind fact lists the current facts with their category, key and recalls. --json gives the
    page as {"records": [...], "total": N, "offset": N, "limit": N}; --format files the ingested files of
    the cards listed.
    """
    fmt = chosen(format_, color)
    if limit < 1 or limit > 100_000:
        raise UsageError("--limit takes a number from 1 to 100000")
    if offset < 0:
        raise UsageError("--offset takes a number of records to skip, 0 or more")
    if kind == "fact" or category is not None:
        if kind not in (None, "fact"):
            raise UsageError("--category goes with --kind fact")
        if tag is not None or since is not None:
            raise UsageError("--tag and --since do not go with --kind fact: use `memories rag search VAULT QUERY --kind fact --tag T --since DATE`")
        _list_facts(vault, category, limit, offset, fmt)
        return
    params: dict[str, Any] = {"vault": vault, "limit": limit, "offset": offset}
    if kind:
        params["kind"] = kind
    if tag is not None:
        params["tag"] = tag
    if since is not None:
        params["since"] = since
    out = call("memory.list", params)
    records = out["records"]
    shown = page_line(len(records), int(out.get("total", len(records))), offset, "record")

    def text() -> None:
        if records:
            table(
                ["ID", "REV", "KIND", "TITLE", "TAGS", "UPDATED"],
                [[r["id"], r["revision"], r["kind"] + (" (private)" if r["private"] else ""), plain(_shown_title(r)), ", ".join(r["tags"]), fmt_time(r["updated"])] for r in records],
            )
        notice(shown)

    emit(fmt, Listing(
        document=out,
        items=records,
        columns=("id", "revision", "kind", "title", "tags", "private", "updated", "source", "text"),
        text=text,
        md_item=lambda r: md_item(r | {"title": _shown_title(r)}, extra=f"{r['kind']}, revision {r['revision']}" + (", private" if r["private"] else "") + "".join(f" #{t}" for t in r["tags"])),
        notices=[shown] if fmt != "json" else [],
    ))


def _shown_title(record: dict[str, Any]) -> str:
    """What names a record in a listing: its title, else a fact's text (facts have no title)."""
    return str(record.get("title") or record.get("text") or "")


def page_line(shown: int, total: int, offset: int, noun: str) -> str:
    """"showing 1–50 of 5,183 records (next page: --offset 50)", or why nothing is shown."""
    if total == 0:
        return f"no {noun}s"
    if shown == 0:
        return f"no {noun}s at --offset {offset:,}: there are {total:,}"
    line = f"showing {offset + 1:,}\u2013{offset + shown:,} of {total:,} {noun}s"
    if offset + shown < total:
        line += f" (next page: --offset {offset + shown})"
    return line


@memory_app.command("update")
def update(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    record_id: Annotated[str, typer.Argument(metavar="ID", help="Record id.")],
    text: Annotated[str | None, typer.Argument(help="New text, or - to read it from stdin.")] = None,
    title: Annotated[str | None, typer.Option("--title", help="New title.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Add a tag (repeatable).")] = None,
    untag: Annotated[list[str] | None, typer.Option("--untag", help="Remove a tag (repeatable).")] = None,
    private: Annotated[bool | None, typer.Option("--private/--public", help="Mark private or public.")] = None,
) -> None:
    """Update a record as a new revision.

    The old revision stays readable until `memories vault compact`.
    """
    params: dict[str, Any] = {"vault": vault, "id": record_id, "tags": tag or [], "untag": untag or []}
    body = _text_arg(text)
    if body is not None:
        params["body"] = body
    if title is not None:
        params["title"] = title
    if private is not None:
        params["private"] = private
    out = call("memory.update", params)
    report(out, f"Updated {out['id']} to revision {out['revision']}.")


@memory_app.command("delete")
def delete(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    record_id: Annotated[str, typer.Argument(metavar="ID", help="Record id.")],
) -> None:
    """Delete a record.

    Its sealed bytes stay in the log until `memories vault compact`; `memories memory forget` removes
    every revision for good.
    """
    out = call("memory.delete", {"vault": vault, "id": record_id})
    report(out, f"Deleted {out['id']}.")


# ---------------------------------------------------------------------------- facts

CATEGORIES = ("profile", "preference", "decision", "pattern", "fact")  # memoriesd.memory.facts.CATEGORIES


def _list_facts(vault: str, category: str | None, limit: int, offset: int, fmt: str) -> None:
    params: dict[str, Any] = {"vault": vault}
    if category is not None:
        if category not in CATEGORIES:
            raise UsageError(f"--category takes {', '.join(CATEGORIES)}")
        params["category"] = category
    out = call("memory.facts", params)
    total = len(out["facts"])
    out["facts"] = out["facts"][offset : offset + limit]  # facts are few: paged here, as `memory.list` pages
    out.update({"total": total, "offset": offset, "limit": limit})
    shown = page_line(len(out["facts"]), total, offset, "fact")

    def text() -> None:
        if out["facts"]:
            table(
                ["ID", "REV", "CATEGORY", "KEY", "TEXT", "RECALLS", "LAST RECALL", "UPDATED"],
                [[f["id"], f["revision"], f["category"], f["key"] or "", f["text"], f["recalls"], fmt_time(f["last_recall"]), fmt_time(f["updated"])] for f in out["facts"]],
            )
        notice(shown)

    emit(fmt, Listing(
        document=out,
        items=out["facts"],
        columns=("id", "revision", "category", "key", "text", "importance", "recalls", "last_recall", "updated"),
        text=text,
        md_item=lambda f: md_item(f, title_key="text", extra=f["category"] + (f" ({f['key']})" if f.get("key") else "")),
        notices=[shown] if fmt != "json" else [],
    ))


@memory_app.command("remember")
def remember(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    text: Annotated[str | None, typer.Argument(help="The fact (3-500 characters), or - to read it from stdin.")] = None,
    category: Annotated[str, typer.Option("--category", metavar="[profile|preference|decision|pattern|fact]", help="What kind of fact it is.")] = "fact",
    key: Annotated[str | None, typer.Option("--key", help="What the fact is about, e.g. typescript: a later fact with the same key in the category revises it.")] = None,
    importance: Annotated[float | None, typer.Option("--importance", help="0 to 1 (default 0.5): the more important profile facts come first in a context pack.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag (repeatable).")] = None,
) -> None:
    """Remember a short fact about the person.

    A fact that restates or revises a current fact of the same
    category (same --key, or the same meaning) becomes a new revision of it; an exact repeat changes nothing.
    Prints the fact's id alone on the last line."""
    if category not in CATEGORIES:
        raise UsageError(f"--category takes {', '.join(CATEGORIES)}")
    body = _text_arg(text)
    if body is None:
        raise UsageError("give the fact as an argument, or - to read it from stdin")
    params: dict[str, Any] = {"vault": vault, "text": body, "category": category, "tags": tag or []}
    if key is not None:
        params["key"] = key
    if importance is not None:
        params["importance"] = importance
    out = call("memory.remember", params)
    if STATE.json:
        emit_json(out)
        return
    for n in out.get("notices", []):
        notice(n)
    if out["action"] == "added":
        notice(f"Added fact {out['id']} ({out['category']}).")
    elif out["action"] == "updated":
        prev = out.get("previous") or {}
        notice(f"Updated fact {out['id']} to revision {out['revision']} (it said: {safe_text(str(prev.get('text', '')))}).")
    else:
        notice(f"Unchanged: fact {out['id']} already says this.")
    print(out["id"])
