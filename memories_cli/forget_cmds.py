"""`memories memory forget`: forget records for good, listing what a query chose and what it passed over.

A query chooses among facts and conversations unless ``--kind`` names more; the notes and cards it
matched but did not choose are listed after it as *passed over (kept)*, with the flags that would
target them. Without ``--yes`` the command lists what would go (a dry run) and asks on the terminal.
:func:`table_listing` (a reply as a titled table between notices) is shared with ``memory summarize``
and ``memory prune`` (tidy_cmds.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from memoriesd.errors import ConfirmationRequired, UsageError

from .formats import ColorOpt, Listing, PlainFormatOpt, chosen, emit, md_item
from .state import call, notice, table


def table_listing(
    out: dict[str, Any],
    items: list[dict[str, Any]],
    columns: Sequence[str],
    table_of: tuple[list[str], list[list[Any]], str],
    md: Callable[[dict[str, Any]], str],
    *,
    before: Sequence[str] = (),
    after: Sequence[str] = (),
    empty: str,
) -> Listing:
    """A reply listed as a titled table (``table_of``: header, rows, title), ``before`` and ``after`` (or
    ``empty`` when nothing is listed) the lines around it on stderr (forget, summarize, prune)."""
    lines = [*before, *(after if items else [empty])]

    def text() -> None:
        for n in before:
            notice(n)
        if items:
            table(table_of[0], table_of[1], title=table_of[2])
        for n in lines[len(before) :]:
            notice(n)

    return Listing(document=out, items=items, columns=columns, text=text, md_item=md, notices=lines)


def _forget_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            r["id"],
            r["kind"] + (" (deleted)" if r.get("deleted") else ""),
            r.get("category") or "",
            r["revisions"],
            r["match"],
            r["title"] or r["text"],
        ]
        for r in records
    ]


_KIND_WORDS = {"memory": "note", "card": "card", "fact": "fact", "conversation": "conversation"}


def _passed_over(out: dict[str, Any]) -> list[str]:
    """What a query matched but did not choose (notes, cards), kept, and how to target them."""
    rows, total = out.get("passed_over") or [], int(out.get("passed_over_total") or 0)
    if not total:
        return []
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    counts = ", ".join(f"{sum(r['kind'] == k for r in rows)} {_KIND_WORDS.get(k, k)}(s)" for k in kinds)
    counts += f" and {total - len(rows)} more" if total > len(rows) else ""
    flags = " / ".join(f"--kind {k}" for k in kinds)
    chose = " and ".join(f"{_KIND_WORDS.get(k, k)}s" for k in out.get("kinds") or ())
    head = "Nothing was chosen: only" if not out["records"] else "Also on the topic, kept:"
    return [
        f"{head} {counts} (a query alone chooses {chose}): to forget them, add {flags}, or name one with --id ID."
    ]


def _forget_listing(
    out: dict[str, Any], title: str, before: Sequence[str] = (), after: Sequence[str] = ()
) -> Listing:
    records, passed, head = (
        out["records"],
        _passed_over(out),
        ["ID", "KIND", "CATEGORY", "REVS", "MATCH", "TEXT"],
    )
    listing = table_listing(
        out,
        records,
        ("id", "kind", "category", "title", "text", "revisions", "deleted", "match", "score"),
        (head, _forget_rows(records), title),
        lambda r: md_item(
            r,
            title_key="title" if r["title"] else "text",
            extra=f"{r['kind']}, {r['revisions']} revision(s), {r['match']}"
            + (", deleted" if r.get("deleted") else ""),
        ),
        before=before,
        after=after,
        empty="nothing to forget",
    )
    if not passed:
        return listing
    end = list(after) if records else []
    listing.notices = [*before, *passed, *end]

    def text() -> None:  # what a query passed over (kept) after what it chose, and how to target it
        for n in before:
            notice(n)
        if records:
            table(head, _forget_rows(records), title=title)
        for n in passed:
            notice(n)
        table(head, _forget_rows(out.get("passed_over") or []), title="passed over (kept)")
        for n in end:
            notice(n)

    listing.text = text
    return listing


def forget(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="A record to forget, of any kind (repeatable).")
    ] = None,
    query: Annotated[
        str | None,
        typer.Option(
            "--query", help="Forget the facts and conversations that say this (see --scope, --kind)."
        ),
    ] = None,
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            metavar="[specific|topic]",
            help="With --query: specific (the fact it restates, else the best-matching record; default) or topic (every record on it).",
        ),
    ] = "specific",
    all_: Annotated[
        bool, typer.Option("--all", help="Every fact (with --kind: every record of that kind).")
    ] = False,
    kinds: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            metavar="[memory|card|fact|conversation|credential|file]",
            help="With --query: choose among these kinds (repeatable; default fact and conversation: notes (memory) and ingested cards (card) are never chosen without it). With --all: every record of these kinds.",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be forgotten.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (needed off a terminal).")] = False,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Forget records for good, every revision included.

    A query forgets what was remembered (facts) or said (conversations), never a note or a card unless --kind names it.
    Every revision, their vectors, index entries and snapshots go, and the vault files are rewritten so the text cannot be read back from them, even with the passphrase (see SECURITY.md
    for what lies beyond the vault's files). Cannot be undone. --format lists what would go (--dry-run) or what went."""
    fmt = chosen(format_, color)
    if scope not in ("specific", "topic"):
        raise UsageError("--scope takes specific or topic")
    params: dict[str, Any] = {"vault": vault, "scope": scope}
    if ids:
        params["ids"] = ids
    if query is not None:
        params["query"] = query
    if all_:
        params["all"] = True
    if kinds:
        params["kind"] = kinds
    if not dry_run and not yes and not sys.stdin.isatty():
        raise ConfirmationRequired(
            "memory forget cannot be undone and there is no terminal to ask: pass --yes to forget (or --dry-run to see what would go)"
        )
    if dry_run or not yes:
        listed = call("memory.forget", {**params, "dry_run": True})
        for n in listed.get("notices", []):
            notice(n)
        if dry_run or not listed["records"]:
            emit(fmt, _forget_listing(listed, "would be forgotten"))
            return
        n = len(listed["records"])
        if fmt != "text":
            notice(f"to forget: {', '.join(r['id'] for r in listed['records'])}")
        else:
            table(
                ["ID", "KIND", "CATEGORY", "REVS", "MATCH", "TEXT"],
                _forget_rows(listed["records"]),
                title="to forget",
            )
        for line in _passed_over(listed):
            notice(line)
        name = listed.get("vault") or vault
        if not typer.confirm(
            f"Forget {'this record' if n == 1 else f'these {n} records'} and every revision from vault {name}, for good?",
            default=False,
        ):
            notice("nothing was forgotten")
            raise typer.Exit(1)
        params = {"vault": vault, "ids": [r["id"] for r in listed["records"]]}  # exactly what was shown
    out = call("memory.forget", params)
    extra = (
        f"; {out['preserved_files_removed']} preserved crash-recovery file(s) removed"
        if out.get("preserved_files_removed")
        else ""
    )
    done = (
        f"Forgot {out.get('forgotten', 0):,} record(s) and {out.get('revisions_removed', 0):,} revision(s) from vault "
        f"{out.get('vault') or vault}; vault files rewritten "
        f"(log epoch {out.get('log_epoch')}, {out.get('vector_entries_dropped', 0)} sealed vectors dropped, "
        f"lexical snapshot {out.get('lexical_snapshot', 'none')}){extra}."
    )
    emit(fmt, _forget_listing(out, "forgotten", before=out.get("notices", []), after=[done]))


def register(app: typer.Typer) -> None:
    """`memory forget` in the `memory` group."""
    from .memory_cmds import memory_app

    memory_app.command("forget")(forget)


__all__ = ["register", "table_listing"]
