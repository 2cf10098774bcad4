"""`memories memory summarize` and `memories memory prune`: tidy memory over time, by hand only."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError

from .state import STATE, call, emit_json, fmt_time, notice, table

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
) -> None:
    """Condense old conversations (or facts) into one summary record.

    The [rag.generation] service writes the summary. Without --apply it lists the candidates and their token total and changes nothing. With --apply the
    records are sent to the service as untrusted data; only when every reply is a valid summary is the
    summary written (kind memory, tag summary) and the originals forgotten for real, as `memory forget`
    does. Cannot be undone. Never runs on its own."""
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
    if STATE.json:
        emit_json(out)
        return
    for n in out.get("notices", []):
        notice(n)
    if not out["candidates"]:
        notice(f"nothing to summarize: no {kind} is {older_than} or more days old")
        return
    rows = [[c["id"], c["day"], c["tokens"], c["batch"] or "-", c["title"] or c["text"]] for c in out["candidates"]]
    title = "would be summarized" if out["dry_run"] else "summarized and forgotten"
    table(["ID", "DATE", "TOKENS", "BATCH", "TEXT"], rows, title=title)
    n_batches = len(out["batches"])
    total = f"{len(out['candidates'])} {kind}(s), {out['tokens']:,} tokens ({out['tokenizer']})"
    if out["dry_run"]:
        notice(f"{total}; {n_batches} summary record(s) would replace them: run again with --apply to do it.")
        return
    for s in out["summaries"]:
        notice(f"Wrote summary {s['id']}: {s['title']} (replaces {s['replaced']} record(s)).")
    notice(f"{total}; {_forgot_line(out)}.")


def prune(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    older_than: Annotated[int | None, typer.Option("--older-than", metavar="DAYS", help="Facts last revised at least this many days ago.")] = None,
    below_importance: Annotated[float | None, typer.Option("--below-importance", metavar="F", help="Facts whose importance is below F (0 to 1).")] = None,
    never_recalled: Annotated[bool, typer.Option("--never-recalled", help="Facts no search or context pack ever returned.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list the stale facts (the default).")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Forget them for real.")] = False,
) -> None:
    """Remove stale facts for good.

    The facts matching every criterion given (at least one) are forgotten for real, as
    `memory forget` does. Private facts are left alone. Without --apply it only lists them. Cannot be
    undone. Never runs on its own."""
    if older_than is None and below_importance is None and not never_recalled:
        raise UsageError("say which facts are stale: --older-than DAYS, --below-importance F and/or --never-recalled")
    params: dict[str, Any] = {"vault": vault, "never_recalled": never_recalled, "apply": _apply_flag(dry_run, apply)}
    if older_than is not None:
        params["older_than"] = older_than
    if below_importance is not None:
        params["below_importance"] = below_importance
    out = call("memory.prune", params)
    if STATE.json:
        emit_json(out)
        return
    if not out["records"]:
        notice("nothing to prune")
        return
    rows = [[f["id"], f["category"], f["importance"], f["recalls"], fmt_time(f["updated"]), f["text"]] for f in out["records"]]
    table(["ID", "CATEGORY", "IMPORTANCE", "RECALLS", "UPDATED", "TEXT"], rows, title="would be forgotten" if out["dry_run"] else "forgotten")
    if out["dry_run"]:
        notice(f"{len(out['records'])} stale fact(s): run again with --apply to forget them.")
    else:
        notice(_forgot_line(out)[0].upper() + _forgot_line(out)[1:] + ".")


def register(app: typer.Typer) -> None:
    """Add the commands to the `memory` group."""
    from .memory_cmds import memory_app

    memory_app.command("summarize")(summarize)
    memory_app.command("prune")(prune)


__all__ = ["register"]
