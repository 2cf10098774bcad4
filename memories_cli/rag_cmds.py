"""`memories rag ...`: ingestion, status, watches, indexing and model-install.

Search, ask and context packs are in :mod:`memories_cli.search_cmds` (registered here, in order).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import MemoriesError, UsageError
from memoriesd.text.humanize import duration

from . import search_cmds
from .progress import Progress, ProgressOpt, interruptible
from .render import home_short, mib, percent, print_summary
from .state import STATE, call, cli_command, emit_json, fmt_time, notice, report, safe_text

rag_app = typer.Typer(help="Ingest documents, search them and ask questions.\n\nAlso keeps folders in sync (watch), embeds fragments (index) and builds context packs for assistants.", no_args_is_help=True, rich_markup_mode=None)


@rag_app.command(
    "ingest",
    epilog="""Examples:

\b
  memories rag ingest notes ~/notes -r              # a folder and the folders under it
  memories rag ingest notes plan.md todo.md --tag travel
  pbpaste | memories rag ingest notes - --title 'Meeting notes'""",
)
def ingest(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    paths: Annotated[list[str], typer.Argument(help="Files or directories (UTF-8 text or Markdown), or - for stdin.")],
    title: Annotated[str | None, typer.Option("--title", help="Title (default: front matter title, else the first # heading, else the file name). Required for -.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag (repeatable).")] = None,
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Walk directories for *.md, *.markdown, *.txt (hidden ones skipped).")] = False,
    private: Annotated[bool, typer.Option("--private", help="Keep the cards private: never indexed, searched or sent.")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="With a directory: remove cards whose source file under it no longer exists.")] = False,
    progress: ProgressOpt = "auto",
) -> None:
    """Ingest Markdown and text files as encrypted knowledge cards.

    Unchanged files are skipped; changed ones get a new revision; moved or renamed ones keep their card.
    To keep a folder in sync as it changes, see `memories rag watch`.
    """
    params: dict[str, Any] = {"vault": vault, "tags": tag or [], "recursive": recursive, "private": private, "prune": prune}
    if title is not None:
        params["title"] = title
    if paths == ["-"]:
        if not title:
            raise UsageError("ingesting stdin (-) needs --title")
        data = sys.stdin.buffer.read()
        try:
            params["text"] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError("stdin is not UTF-8 text: convert it to text or Markdown first") from exc
    elif "-" in paths:
        raise UsageError("- (stdin) cannot be mixed with paths")
    else:
        params["paths"] = [_ingest_path(p) for p in paths]
    with Progress("ingest", progress) as bar, interruptible(INGEST_INTERRUPTED, bar):

        def on_progress(p: dict[str, Any]) -> None:
            if "total" in p:
                bar.update("ingest", int(p["done"]), int(p["total"]))

        out = call("rag.ingest", params, progress=on_progress)
    for r in out["refused"]:
        sys.stderr.write(safe_text(f"refused: {r['path']}: {r['message']}") + "\n")
    if out.get("skipped_outside"):
        n = int(out["skipped_outside"])
        shown = list(out.get("skipped_outside_paths") or [])
        names = ", ".join(shown[:3]) + (", ..." if len(shown) > 3 else "")
        sys.stderr.write(safe_text(f"{n:,} skipped: {_outside_links(n)} ({names}); to include what "
                                   f"{'it points' if n == 1 else 'one points'} to, ingest that by name") + "\n")
    moved = f", moved {out['moved']}" if out.get("moved") else ""
    report(out, f"added {out['added']:,}, updated {out['updated']:,}, unchanged {out['unchanged']:,}{moved}, refused {len(out['refused']):,}" + (f", pruned {out['pruned']:,}" if prune else ""))
    if out["refused"]:
        raise typer.Exit(1)


#: What Ctrl-C leaves of an ingest: the daemon stops at its next file; what it stored is kept.
INGEST_INTERRUPTED = (
    "the daemon stops at its next file and keeps those stored; run the same command again to finish "
    "(unchanged files are skipped)"
)
#: What Ctrl-C leaves of `rag index`: embedded batches are kept; the background indexer goes on.
INDEX_INTERRUPTED = (
    "fragments embedded so far are kept; with [index] background on (the default with a local model) the daemon "
    "goes on embedding: `memories rag status {vault}` shows where it is"
)


def _outside_links(n: int) -> str:
    return "a symbolic link pointing outside the folder" if n == 1 else "symbolic links pointing outside the folder"


def _ingest_path(arg: str) -> str:
    """A named path made absolute, refused (usage error) when its name is not UTF-8."""
    path = str(Path(arg).expanduser().absolute())
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = safe_text(os.fsencode(path).decode("utf-8", "backslashreplace"))
        raise UsageError(
            f"the path {shown} is not valid UTF-8 (bytes shown as \\x escapes): rename it, then ingest it again"
        ) from None
    return path


rag_app.command("search", epilog=search_cmds.SEARCH_EPILOG)(search_cmds.search)


@rag_app.command("status")
def status(vault: Annotated[str, typer.Argument(help="Vault id or name.")]) -> None:
    """Show a vault's documents, fragments, caps, embedding progress, model and watched folders.

    A short summary: documents and fragments, the share of each cache cap in use, how many fragments
    have vectors (and the background indexing), the embedding model and why it serves this vault,
    the watched folders; then the next step to take.
    """
    out = call("rag.status", {"vault": vault})
    if STATE.json:
        emit_json(out)
        return
    if out.get("cap_error"):
        notice(out["cap_error"])
    for text in out.get("notices") or []:  # e.g. a model that does not read the vault's language
        notice(text)
    rows, hints = status_rows(out, vault)
    title = f"Vault {vault}" + (f" ({out['vault_id']})" if out.get("vault_id") and out["vault_id"] != vault else "")
    print_summary(title, rows, hints)


def status_rows(out: dict[str, Any], vault: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The rows of `rag status` and the next steps it suggests."""
    emb, cache = out["embedding"], out["cache"]
    frags = out["fragments"]
    records = int(out.get("searchable_records") or 0)
    rows = [("Documents", f"{out['documents']:,} ingested files ({mib(out['bytes'])}), {records:,} searchable records in all")]
    index = {"built": "index built", "stale": "index out of date, rebuilt on the next search", "none": "index built on the first search", "over_cap": "over a cap: not indexed"}.get(str(out["index"]), str(out["index"]))
    if frags is not None:
        rows.append(("Fragments", f"{frags:,} of {cache['max_fragments']:,} allowed ({percent(frags, cache['max_fragments'])}); {index}"))
    rows.append(("Source text", f"{mib(cache['source_bytes'])} of {cache['max_source_mib']:g} MiB ({percent(cache['source_bytes'], cache['max_source_mib'] * 1048576)})"))
    embedded, total = emb.get("embedded"), emb.get("total")
    if embedded is not None and total:
        line = f"{embedded:,} of {total:,} fragments have vectors ({percent(embedded, total)})"
        if frags is not None and 0 < frags < total:  # the rest: conversation turn windows
            line = (f"{embedded:,} of {total:,} vectors made ({percent(embedded, total)}): one per fragment and "
                    f"{total - frags:,} for conversation turn windows")
        if emb.get("skipped"):
            line += f"; {emb['skipped']:,} the model cannot embed (still found by bm25)"
        if emb.get("vectors_loaded") is False:
            line += "; sealed on disk, loaded on the first vector search"
        rows.append(("Vectors", line))
        if emb.get("vector_bytes") is not None:
            rows.append(("Vector memory", f"{mib(emb['vector_bytes'])} of {cache['max_vector_mib']:g} MiB ({percent(emb['vector_bytes'], cache['max_vector_mib'] * 1048576)})"))
    state = emb.get("state")
    if state not in (None, "off", "idle"):
        line = f"background indexing {state}"
        if emb.get("rate"):
            line += f", {emb['rate']:.1f} fragments/s"
        if emb.get("eta_seconds"):
            line += f", about {duration(float(emb['eta_seconds']))} left"
        if emb.get("error"):
            line += f": {emb['error']}"
        rows.append(("Embedding", line))
    if embedded is not None:
        model, source = str(emb.get("model", "?")), emb.get("source")
        rows.append(("Model", f"{home_short(str(source))} (identity {model[:16]}…)" if source and source != model else home_short(model)))
    elif emb.get("available"):
        rows.append(("Model", f"{home_short(str(emb.get('model')))} (vectors load on the first vector search or `rag index`)"))
    elif emb.get("served_by") == "none":
        rows.append(("Model", f"none, so search is lexical (bm25) only: {emb.get('reason', '')}"))
    else:
        rows.append(("Model", "none, so search is lexical (bm25) only"))
    if emb.get("served_by") not in (None, "none"):  # which embedder serves this vault and why ([embedding] source)
        rows.append(("Served by", f"{emb['served_by']}: {emb.get('reason', '')}"))
    if lang := emb.get("language"):  # memoriesd.rag.language: the vault's script against the model's
        reads = {True: "the model reads it", False: "the model does not read it", None: "not yet measured"}[lang.get("model_reads")]
        rows.append(("Language", f"mostly {lang['script']} ({lang['share']:.0%} of letters); {reads}; "
                                 f"default search mode {emb.get('default_mode', 'hybrid')}"))
    watches = out.get("watch", [])
    for i, w in enumerate(watches):
        rows.append(("Watching" if i == 0 else "", _watch_line(w)))
    hints: list[tuple[str, str]] = []
    if out["index"] == "over_cap":
        hints.append((f"edit [index] in {STATE.home.config_path}", "raise the cap named above, then run `memories daemon restart`"))
    if not records:
        hints.append((cli_command("rag", "ingest", vault, "FOLDER", "-r"), "add Markdown and text files (or `memories memory add`)"))
    if not emb.get("available"):
        hints.append((cli_command("rag", "model-install"), "install the embedding model for semantic (vector and hybrid) search"))
    elif embedded is not None and total and embedded + int(emb.get("skipped") or 0) < total and state not in ("running", "queued"):
        hints.append((cli_command("rag", "index", vault), "embed the fragments that have no vector yet"))
    if records and not watches:
        hints.append((cli_command("rag", "watch", vault, "FOLDER", "-r"), "keep a folder in sync as it changes"))
    if records:
        hints.append((cli_command("rag", "search", vault, "QUERY"), "search the vault"))
    return rows, hints


def _watch_line(w: dict[str, Any]) -> str:
    """One watched folder for `rag status`: state, last sync, pending changes, counts, error."""
    line = f"{home_short(str(w['path']))}: {w['state']}"
    if w.get("last_sync"):
        line += f", last sync {fmt_time(float(w['last_sync']))}"
    if w.get("pending"):
        line += f", {w['pending']} pending"
    if "ingested" in w:
        line += f", {w['ingested']} ingested, {w['moved']} moved, {w['removed']} removed"
    if w.get("refused"):
        line += f", {w['refused']} refused in the last sync"
    if w.get("skipped_outside"):
        line += f", {w['skipped_outside']} skipped in the last sync ({_outside_links(int(w['skipped_outside']))})"
    if w.get("error"):
        line += f": {w['error']}"
    elif w.get("notice"):
        line += f"; {w['notice']}"
    return line


@rag_app.command("watch")
def watch(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    path: Annotated[str, typer.Argument(help="The folder to keep in sync.")],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Also the folders under it (hidden ones skipped; symlinked folders not followed).")] = False,
    include: Annotated[list[str] | None, typer.Option("--include", help="File glob to take (repeatable; default *.md, *.markdown, *.txt). A glob with / matches the path under the folder, else the file name.")] = None,
    prune: Annotated[bool, typer.Option("--prune", help="Remove the card of a file deleted from the folder (never while the folder itself is missing).")] = False,
) -> None:
    """Keep a folder in sync with the vault while it is unlocked.

    New and changed files are ingested by the daemon, moved files keep their cards, and changes made
    while the vault was locked are caught up at unlock. Writes a [[watch.folder]] table to config.toml
    (comments kept) and applies it at once. Running it again for the same folder changes its options.
    """
    from .watch_config import WatchEntry, set_watch

    folder = os.path.normpath(_ingest_path(path))
    if not Path(folder).is_dir():
        raise UsageError(f"{folder} is not a folder: name the folder to keep in sync")
    info = call("vault.status", {"vault": vault})
    entry = WatchEntry(str(info["vault_id"]), str(info["name"]), folder, recursive, [g for g in include or [] if g.strip()], prune)
    home = STATE.home
    change = set_watch(home.config_path, home.run / "config-edit.lock", entry)
    row = _reloaded(entry)
    result = {"change": change, "config": str(home.config_path), "watch": row}
    if row is None:
        when = "the daemon did not list it: see `memories rag status`"
    elif row["state"] == "locked":
        when = f"it starts when vault {entry.vault_name} is unlocked"
    elif row["state"] == "error":
        when = f"it cannot be watched now: {row['error']}"
    else:
        when = "it is caught up now and synced after every change"
    report(result, f"{change} the watch of {folder} for vault {entry.vault_name} in {home.config_path}; {when}")


@rag_app.command("unwatch")
def unwatch(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    path: Annotated[str, typer.Argument(help="The watched folder.")],
) -> None:
    """Stop keeping a folder in sync.

    Removes its [[watch.folder]] table from config.toml (comments kept) and applies it at once. Cards
    already made from the folder stay in the vault.
    """
    from .watch_config import WatchEntry, remove_watch

    folder = os.path.normpath(_ingest_path(path))
    info = call("vault.status", {"vault": vault})
    entry = WatchEntry(str(info["vault_id"]), str(info["name"]), folder)
    home = STATE.home
    removed = remove_watch(home.config_path, home.run / "config-edit.lock", entry)
    _reloaded(entry)
    report({"removed": removed, "config": str(home.config_path), "path": folder}, f"stopped watching {folder} for vault {entry.vault_name}; its cards stay in the vault")


def _reloaded(entry: Any) -> dict[str, Any] | None:
    """Ask the daemon to apply config.toml's watch list now; the row of this folder, if listed."""
    out = call("rag.watch_reload", {})
    rows = [w for w in out["watches"] if w.get("vault_id") == entry.vault_id and w["path"] == entry.path]
    return rows[0] if rows else None


#: Passes in a row that a vault change ended before one batch was kept, before `rag index` gives up.
MAX_IDLE_CHANGES = 20


@rag_app.command("index")
def index(vault: Annotated[str, typer.Argument(help="Vault id or name.")], progress: ProgressOpt = "auto") -> None:
    """Embed every fragment that has no vector yet.

    Repeats budgeted passes until done, also across vault changes. Ends with one line: fragments
    embedded and skipped, the time taken and the rate.
    """
    embedded_total = 0
    started = time.monotonic()
    with Progress("embed", progress) as bar, interruptible(INDEX_INTERRUPTED.format(vault=vault), bar):

        def on_progress(p: dict[str, Any]) -> None:
            eta = p.get("eta_seconds")
            bar.update("embed", int(p["done"]), int(p["total"]), None if eta is None else float(eta))

        idle_changes = 0
        while True:
            out = call("rag.index", {"vault": vault}, progress=on_progress)
            embedded_total += out["embedded"]
            bar.update("embed", out["total"] - out["remaining"], out["total"])
            if out.get("changed"):
                # The vault changed during the pass (e.g. an ingest running beside us): go on with the new
                # content, unless it keeps changing faster than one batch can be embedded.
                idle_changes = 0 if out["embedded"] else idle_changes + 1
                if idle_changes >= MAX_IDLE_CHANGES:
                    raise MemoriesError(
                        "the vault kept changing before any fragment could be embedded: "
                        "run `memories rag index` again when the ingestion has finished",
                        code="index_stalled",
                    )
                continue
            if out["remaining"] == 0:
                break
            if out["embedded"] == 0:
                raise MemoriesError("no progress was made embedding fragments: see the daemon log", code="index_stalled")
    seconds = time.monotonic() - started
    skipped = int(out.get("skipped") or 0)
    result = {"embedded": embedded_total, "skipped": skipped, "total": out["total"], "seconds": round(seconds, 3), "model": out["model"]}
    fragments = out.get("fragments")
    if fragments is not None:
        result["fragments"] = fragments  # the rest of total: conversation turn windows
    report(result, index_summary(embedded_total, skipped, int(out["total"]), seconds, None if fragments is None else int(fragments)))


def index_summary(embedded: int, skipped: int, total: int, seconds: float, fragments: int | None = None) -> str:
    """The plain last line of `rag index` (the model's identity hash is in --json only). With
    ``fragments`` under ``total``, the rest are conversation turn windows: counted as vectors."""
    windows = total - fragments if fragments is not None and 0 < fragments < total else 0
    unit = "vector" if windows else "fragment"
    took = f"{seconds:.1f} s" if seconds < 90 else duration(seconds)
    rate = f" ({embedded / seconds:,.1f} {unit}s/s)" if embedded and seconds > 0 else ""
    line = f"Embedded {embedded:,} {unit}{'s' if embedded != 1 else ''} in {took}{rate}; skipped {skipped:,}"
    line += " the model cannot embed (still found by bm25)" if skipped else ""
    if windows:
        return line + f". {total - skipped:,} of {total:,} vectors made: one per fragment ({fragments:,}) and {windows:,} for conversation turn windows."
    return line + f". {total - skipped:,} of {total:,} fragments have vectors."


rag_app.command("ask", epilog=search_cmds.ASK_EPILOG)(search_cmds.ask)
rag_app.command("context")(search_cmds.context)


@rag_app.command("model-install")
def model_install(
    dir_: Annotated[Path | None, typer.Option("--dir", help="Install here instead of HOME/models/embeddinggemma.")] = None,
    progress: ProgressOpt = "auto",
) -> None:
    """Download the pinned EmbeddingGemma-300M model.

    About 209 MiB; every file's SHA-256 is verified; files already in place are reused.
    """
    params: dict[str, Any] = {}
    if dir_ is not None:
        params["dir"] = str(dir_.expanduser().absolute())
    interrupted = "files verified so far are kept; run the same command again to go on"
    with Progress("download", progress) as bar, interruptible(interrupted, bar):

        def on_progress(p: dict[str, Any]) -> None:
            if "total" in p and "done" in p:
                bar.update(p["file"], int(p["done"]), int(p["total"]))
            elif p.get("status"):
                bar.status(f"{p['file']}: {p['status']}")

        out = call("rag.model_install", params, progress=on_progress)
    if STATE.json:
        emit_json(out)
        return
    notice(f"model files in {out['dir']}: {out.get('downloaded', 0)} downloaded, {out.get('reused', 0)} reused")
    if out.get("notice"):
        notice(out["notice"])


def register_memory_search(app: typer.Typer) -> None:
    """`memory search` in the `memory` group (`memories rag ...` alone does not import memory_cmds)."""
    from .memory_cmds import memory_app

    memory_app.command("search", epilog=search_cmds.MEMORY_SEARCH_EPILOG)(search_cmds.memory_search)


def register_rag(app: typer.Typer) -> None:
    """`memories rag` alone (memories_cli/main.py imports each group when it runs)."""
    app.add_typer(rag_app, name="rag")


__all__ = ["register_memory_search", "register_rag", "Callable"]
