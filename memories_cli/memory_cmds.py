"""`memories memory ...`: add, read, list, update, delete and search records."""

from __future__ import annotations

import base64
import os
import stat
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError

from .state import STATE, call, emit_json, fmt_time, notice, report, safe_text, table

memory_app = typer.Typer(help="Keep notes, credentials and files in a vault.", no_args_is_help=True, rich_markup_mode=None)

MAX_FILE = 6 * 1024 * 1024


def _special_kind(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO (named pipe)"...), or None for a regular file."""
    from memoriesd.text.documents import non_regular_kind

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
    kind: Annotated[str, typer.Option("--kind", help="memory, credential or file.")] = "memory",
    file: Annotated[Path | None, typer.Option("--file", help="With --kind file: the file to seal (any bytes).")] = None,
) -> None:
    """Add a record. Prints its id alone on the last line."""
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
    record_id: Annotated[str, typer.Argument(metavar="ID", help="Record id.")],
    revision: Annotated[int | None, typer.Option("--revision", help="An older revision.")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="For a file resource: write its bytes here.")] = None,
) -> None:
    """Show a record (or write a file resource's bytes with --output)."""
    params: dict[str, Any] = {"vault": vault, "id": record_id, "with_data": output is not None}
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
) -> None:
    """List a record's revisions (readable until compaction removes them)."""
    out = call("memory.history", {"vault": vault, "id": record_id})
    if STATE.json:
        emit_json(out)
        return
    table(["REVISION", "UPDATED", "TITLE"], [[r["revision"], fmt_time(r["updated"]), "(deleted)" if r["deleted"] else r["title"]] for r in out["revisions"]])


@memory_app.command("list")
def list_(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    kind: Annotated[str | None, typer.Option("--kind", help="Only this kind (memory, card, credential, file).")] = None,
) -> None:
    """List records, newest first."""
    params: dict[str, Any] = {"vault": vault}
    if kind:
        params["kind"] = kind
    out = call("memory.list", params)
    if STATE.json:
        emit_json(out)
        return
    table(
        ["ID", "REV", "KIND", "TITLE", "TAGS", "UPDATED"],
        [[r["id"], r["revision"], r["kind"] + (" (private)" if r["private"] else ""), r["title"], ", ".join(r["tags"]), fmt_time(r["updated"])] for r in out["records"]],
    )


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
    """Update a record: a new revision (the old one stays readable until compaction)."""
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
    """Delete a record (its sealed bytes stay in the log until `vault compact`)."""
    out = call("memory.delete", {"vault": vault, "id": record_id})
    report(out, f"Deleted {out['id']}.")
