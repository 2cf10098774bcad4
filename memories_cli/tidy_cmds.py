"""`memories memory summarize` and `memories memory prune`: tidy memory over time, by hand only."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError

from .forget_cmds import table_listing
from .formats import ColorOpt, PlainFormatOpt, chosen, emit, md_item
from .state import call, fmt_time

KINDS = ("conversation", "fact")  # memoriesd.memory.tidy.SUMMARIZE_KINDS


def _apply_flag(dry_run: bool, apply: bool) -> bool:
    if dry_run and apply:
        raise UsageError("--dry-run and --apply exclude each other: give one (without either, nothing is changed)")
    return apply


def _forgot_line(out: dict[str, Any]) -> str:
    return (
        f"forgot {out['forgotten']} record(s) and {out.get('revisions_removed', 0)} revision(s); vault files rewritten "
        f"(log epoch {out.get('log_epoch')}, {out.get('vector_entries_dropped', 0)} sealed vectors dropped, "
        f"lexical snapshot {out.get('lexical_snapshot', 'none')})"
    )


def summarize(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    older_than: Annotated[int, typer.Option("--older-than", metavar="DAYS", help="Records at least this many days old (0: all). A conversation's age counts from its session date when known, a fact's from its last revision.")],
    kind: Annotated[str, typer.Option("--kind", metavar="[conversation|fact]", help="What to condense.")] = "conversation",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list the candidates and their token total (the default).")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Write the summary and forget the originals for real.")] = False,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Tokens of record text sent in one generation request (200-100,000): more old records make several summaries.")] = 6000,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Condense old conversations (or facts) into one summary record.

    The [generation] service writes the summary. Without --apply it lists the candidates and their token total and changes nothing. With --apply the
    records are sent to the service as untrusted data; only when every reply is a valid summary is the
    summary written (kind memory, tag summary) and the originals forgotten for real, as `memory forget`
    does. Cannot be undone. Never runs on its own."""
    fmt = chosen(format_, color)
    if kind not in KINDS:
        raise UsageError(f"--kind takes {' or '.join(KINDS)}")
    params: dict[str, Any] = {
        "vault": vault,
        "kind": kind,
        "older_than": older_than,
        "apply": _apply_flag(dry_run, apply),
        "batch_tokens": batch_tokens,
    }
    out = call("memory.summarize", params)
    cands = out["candidates"]
    rows = [[c["id"], c["day"], c["tokens"], c["batch"] or "-", c["title"] or c["text"]] for c in cands]
    title = "would be summarized" if out["dry_run"] else "summarized and forgotten"
    total = f"{len(cands)} {kind}(s), {out['tokens']:,} tokens ({out['tokenizer']})"
    if out["dry_run"]:
        after = [f"{total}; {len(out['batches'])} summary record(s) would replace them: run again with --apply to do it."]
    else:
        after = [f"Wrote summary {s['id']}: {s['title']} (replaces {s['replaced']} record(s))." for s in out["summaries"]]
        after.append(f"{total}; {_forgot_line(out)}.")
    emit(fmt, table_listing(
        out, cands, ("id", "kind", "title", "text", "day", "tokens", "batch"), (["ID", "DATE", "TOKENS", "BATCH", "TEXT"], rows, title),
        lambda c: md_item(c, title_key="title" if c["title"] else "text", extra=f"{c['day']}, {c['tokens']:,} tokens" + (f", batch {c['batch']}" if c["batch"] else "")),
        before=out.get("notices", []), after=after, empty=f"nothing to summarize: no {kind} is {older_than} or more days old",
    ))


def prune(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    older_than: Annotated[int | None, typer.Option("--older-than", metavar="DAYS", help="Facts last revised at least this many days ago.")] = None,
    below_importance: Annotated[float | None, typer.Option("--below-importance", metavar="F", help="Facts whose importance is below F (0 to 1).")] = None,
    never_recalled: Annotated[bool, typer.Option("--never-recalled", help="Facts no search or context pack ever returned.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list the stale facts (the default).")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Forget them for real.")] = False,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Remove stale facts for good.

    The facts matching every criterion given (at least one) are forgotten for real, as
    `memory forget` does. Private facts are left alone. Without --apply it only lists them. Cannot be
    undone. Never runs on its own."""
    fmt = chosen(format_, color)
    if older_than is None and below_importance is None and not never_recalled:
        raise UsageError("say which facts are stale: --older-than DAYS, --below-importance F and/or --never-recalled")
    params: dict[str, Any] = {"vault": vault, "never_recalled": never_recalled, "apply": _apply_flag(dry_run, apply)}
    if older_than is not None:
        params["older_than"] = older_than
    if below_importance is not None:
        params["below_importance"] = below_importance
    out = call("memory.prune", params)
    facts = out["records"]
    rows = [[f["id"], f["category"], f["importance"], f["recalls"], fmt_time(f["updated"]), f["text"]] for f in facts]
    if out["dry_run"]:
        after = f"{len(facts)} stale fact(s): run again with --apply to forget them."
    else:
        after = _forgot_line(out)[0].upper() + _forgot_line(out)[1:] + "."
    emit(fmt, table_listing(
        out, facts, ("id", "revision", "category", "key", "text", "importance", "recalls", "last_recall", "updated"),
        (["ID", "CATEGORY", "IMPORTANCE", "RECALLS", "UPDATED", "TEXT"], rows, "would be forgotten" if out["dry_run"] else "forgotten"),
        lambda f: md_item(f, title_key="text", extra=f"{f['category']}, importance {f['importance']}, {f['recalls']} recall(s)"),
        before=out.get("notices", []), after=[after], empty="nothing to prune",
    ))


def register(app: typer.Typer) -> None:
    """Add the commands to the `memory` group."""
    from .memory_cmds import memory_app

    memory_app.command("summarize")(summarize)
    memory_app.command("prune")(prune)


__all__ = ["register"]
