"""`memories rag ...` and `memories memory search`: ingestion, search, indexing, status, ask, model-install."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from memoriesd.errors import MemoriesError, UsageError
from memoriesd.text.humanize import duration

from .conversation_cmds import titled
from .state import STATE, call, echo, emit_json, fmt_time, notice, report, safe_text, table

rag_app = typer.Typer(help="Ingest documents, search them and ask questions.\n\nAlso keeps folders in sync (watch), embeds fragments (index) and builds context packs for assistants.", no_args_is_help=True, rich_markup_mode=None)

SearchMode = Literal["bm25", "vector", "hybrid"]  # memoriesd.rag.search.MODES
Mode = Annotated[SearchMode | None, typer.Option("--mode", help="Lexical, semantic or both (default: hybrid when an embedding model is usable for this vault, else bm25).")]
MatchMode = Annotated[Literal["any", "all", "phrase"], typer.Option("--match-mode", help="Any term, every term, or the exact phrase.")]
Limit = Annotated[int, typer.Option("--limit", help="How many results (1-100).")]
CardsOnly = Annotated[bool, typer.Option("--cards-only", help="Only ingested knowledge cards.")]
NoRerank = Annotated[bool, typer.Option("--no-rerank", help="Skip reranking (light heuristic or the configured service).")]
# Repeatable options cannot be a typer Choice: the metavar lists what the daemon accepts (memoriesd.rag.filters).
Kind = Annotated[list[str] | None, typer.Option("--kind", metavar="[memory|card|fact|conversation]", help="Only records of this kind (repeatable: any of them).")]
Category = Annotated[list[str] | None, typer.Option("--category", metavar="[profile|preference|decision|pattern|fact]", help="Only facts of this category (repeatable: any of them).")]
Tag = Annotated[list[str] | None, typer.Option("--tag", metavar="TAG", help="Only records with this tag (repeatable: every one of them).")]
Since = Annotated[str | None, typer.Option("--since", metavar="DATE", help="Only records dated on or after this ISO date (YYYY-MM-DD): a conversation's session date, else front matter date:, else the day the record was created.")]
Until = Annotated[str | None, typer.Option("--until", metavar="DATE", help="Only records dated on or before this ISO date (YYYY-MM-DD).")]
Speaker = Annotated[list[str] | None, typer.Option("--speaker", metavar="NAME", help="Only conversation excerpts holding a turn by this speaker (case-insensitive; repeatable: any of them).")]


def _filters(kind: list[str] | None, category: list[str] | None, tag: list[str] | None, since: str | None, until: str | None, speaker: list[str] | None = None) -> dict[str, Any]:
    """The request params of --kind, --category, --tag, --since, --until and --speaker (the daemon validates them)."""
    out: dict[str, Any] = {}
    if speaker:
        out["speakers"] = speaker
    if kind:
        out["kinds"] = kind
    if category:
        out["categories"] = category
    if tag:
        out["tags"] = tag
    if since is not None:
        out["since"] = since
    if until is not None:
        out["until"] = until
    return out


class Progress:
    """A rich progress bar with ETA on a terminal; otherwise one JSON object per line on stderr
    (``{"progress": "embed", "done": 120, "total": 14747, "eta_seconds": 3400.0}``), at most every 2 s."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._last_line = 0.0
        self._last: tuple[str, int] = ("", -1)

    def __enter__(self) -> Progress:
        if self.tty:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=False
            )
            self._download_cols = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, name: str, done: int, total: int, eta_seconds: float | None = None) -> None:
        if self._bar is not None:
            task = self._tasks.get(name)
            if task is None:
                task = self._tasks[name] = self._bar.add_task(name, total=total)
            self._bar.update(task, completed=done, total=total)
            return
        now = time.monotonic()
        if (now - self._last_line >= 2.0 or done >= total) and (name, done) != self._last:
            self._last_line = now
            self._last = (name, done)
            line: dict[str, Any] = {"progress": name, "done": done, "total": total}
            if eta_seconds is not None:
                line["eta_seconds"] = eta_seconds
            sys.stderr.write(json.dumps(line, ensure_ascii=False) + "\n")


def _progress_cm(label: str) -> AbstractContextManager[Any]:
    return Progress(label) if not STATE.json else nullcontext(None)


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
    with _progress_cm("ingest") as bar:

        def on_progress(p: dict[str, Any]) -> None:
            if bar is not None and "total" in p:
                bar.update("ingest", int(p["done"]), int(p["total"]))

        out = call("rag.ingest", params, progress=on_progress)
    for r in out["refused"]:
        sys.stderr.write(safe_text(f"refused: {r['path']}: {r['message']}") + "\n")
    moved = f", moved {out['moved']}" if out.get("moved") else ""
    report(out, f"added {out['added']:,}, updated {out['updated']:,}, unchanged {out['unchanged']:,}{moved}, refused {len(out['refused']):,}" + (f", pruned {out['pruned']:,}" if prune else ""))
    if out["refused"]:
        raise typer.Exit(1)


def home_short(path: str) -> str:
    """An absolute path as text output shows it: under the home directory as ``~/...`` (``--json`` keeps it whole)."""
    home = os.path.expanduser("~").rstrip(os.sep)
    if home and home != "~" and path.startswith(home + os.sep):
        return "~" + path[len(home) :]
    return path


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


#: Hex characters of a fragment's fingerprint in the `rag search` table (`--json` has all 32).
FINGERPRINT_SHOWN = 12


def _print_fragments(out: dict[str, Any]) -> None:
    for n in out.get("notices", []):
        notice(n)
    if not out["results"]:
        notice("nothing relevant found")
        return
    rows = []
    for r in out["results"]:
        text = " ".join(r["text"].split())
        fingerprint = str(r.get("fingerprint") or "")[:FINGERPRINT_SHOWN]  # a prefix of --json's 32 hex
        rows.append([f"[{r['label']}]", f"{r['score']:.4f}", titled(r), f"{r['record_id']}@{r['revision']}", fingerprint, f"{r['start']}-{r['end']}", text[:160] + ("…" if len(text) > 160 else "")])
    table(["", "SCORE", "TITLE", "RECORD@REV", "FINGERPRINT", "BYTES", "TEXT"], rows, title=f"mode: {out['mode']}")


@rag_app.command(
    "search",
    epilog="""Examples:

\b
  memories rag search notes "garden soil"
  memories rag search notes 长城 --mode bm25 --limit 5
  memories rag search notes "trip plan" --kind card --since 2024-01-01 --json""",
)
def search(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    mode: Mode = None,
    match_mode: MatchMode = "any",
    limit: Limit = 10,
    cards_only: CardsOnly = False,
    no_rerank: NoRerank = False,
    min_score: Annotated[float | None, typer.Option("--min-score", help="Vector/hybrid: the cosine a fragment BM25 did not match needs to be shown (default: the model's calibrated floor, [rag] ask_min_cosine); -1 shows the nearest fragments however far.")] = None,
    rrf_k: Annotated[int | None, typer.Option("--rrf-k", help="Reciprocal rank fusion k (default [rag] rrf_k = 60).")] = None,
    vector_weight: Annotated[float | None, typer.Option("--vector-weight", help="Hybrid: the vector side's weight, BM25's being 1 (default [rag] vector_weight, else the model's).")] = None,
    fusion: Annotated[Literal["convex", "rrf"] | None, typer.Option("--fusion", help="Hybrid: convex (normalised scores) or rrf (reciprocal ranks); default [rag] fusion.")] = None,
    kind: Kind = None,
    category: Category = None,
    tag: Tag = None,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
) -> None:
    """Search fragments, best first, with citation labels.

    Results are labelled [S1], [S2] and so on, with their record, revision and byte range. The filters
    (--kind, --category, --tag, --since, --until, --speaker) narrow both the lexical and the vector
    candidates before they are ranked. For one line per record, see `memories memory search`.

    Vector and hybrid search leave out fragments that match neither the query's words nor, above the
    model's relevance floor, its meaning: a query on nothing in the vault says "nothing relevant found"
    (exit 0). --min-score -1 shows the nearest fragments anyway.
    """
    params: dict[str, Any] = {"vault": vault, "query": query, "match_mode": match_mode, "limit": limit, "cards_only": cards_only, "no_rerank": no_rerank}
    params.update(_filters(kind, category, tag, since, until, speaker))
    if mode:
        params["mode"] = mode
    if min_score is not None:
        params["min_score"] = min_score
    if rrf_k is not None:
        params["rrf_k"] = rrf_k
    if vector_weight is not None:
        params["vector_weight"] = vector_weight
    if fusion is not None:
        params["fusion"] = fusion
    out = call("rag.search", params)
    if STATE.json:
        emit_json({"mode": out["mode"], "results": out["results"], "ignored_terms": out["ignored_terms"], "notices": out["notices"]})
        return
    _print_fragments(out)


@rag_app.command("status")
def status(vault: Annotated[str, typer.Argument(help="Vault id or name.")]) -> None:
    """Show a vault's documents, vectors, caps and watches.

    Documents, fragments and bytes; the index state; vectors and the embedding model in use; cache
    use against the caps; and the watched folders.
    """
    out = call("rag.status", {"vault": vault})
    if STATE.json:
        emit_json(out)
        return
    emb = out["embedding"]
    if out.get("cap_error"):
        notice(out["cap_error"])
    frags = "?" if out["fragments"] is None else f"{out['fragments']:,}"
    rows = [
        ["documents", f"{out['documents']:,}"],
        ["fragments", f"{frags} (cap {out['cache']['max_fragments']:,})"],
        ["bytes", f"{out['bytes']:,}"],
        ["index", out["index"]],
        ["source text", f"{out['cache']['source_bytes'] / 1048576:.2f} MiB (cap {out['cache']['max_source_mib']:g} MiB)"],
    ]
    if emb.get("embedded") is not None:
        # Not loaded yet: counted from the sealed vectors on disk (they load on first vector search).
        where = "" if emb.get("vectors_loaded", True) else ", sealed on disk, not loaded yet"
        rows.append(["vectors", f"{emb['embedded']:,} / {emb['total']:,} fragments, {emb['vector_bytes'] / 1048576:.2f} MiB (cap {out['cache']['max_vector_mib']:g} MiB){where}"])
        if emb.get("skipped"):
            rows.append(["skipped", f"{emb['skipped']:,} fragments the model cannot embed (still found by bm25)"])
        if emb.get("state") not in (None, "off", "idle"):
            line = str(emb["state"])
            if emb.get("rate"):
                line += f", {emb['rate']:.1f} fragments/s"
            if emb.get("eta_seconds"):
                line += f", about {duration(float(emb['eta_seconds']))} left"
            if emb.get("error"):
                line += f": {emb['error']}"
            rows.append(["background", line])
        model = str(emb.get("model", "?"))
        source = emb.get("source")
        rows.append(["model", f"{source} (identity {model[:16]}…)" if source and source != model else model])
    elif emb.get("available"):
        rows.append(["model", f"{emb.get('model')} (vectors load on first vector search or `rag index`)"])
    else:
        rows.append(["model", "none: " + emb.get("hint", "")])
    if emb.get("served_by"):  # which embedder serves this vault and why ([rag] embedding_source)
        rows.append(["embedding", f"{emb['served_by']}: {emb.get('reason', '')}"])
    for w in out.get("watch", []):
        rows.append(["watch", _watch_line(w)])
    table(["", ""], rows)


def _watch_line(w: dict[str, Any]) -> str:
    """One watched folder for `rag status`: state, last sync, pending changes, counts, error."""
    line = f"{w['path']}: {w['state']}"
    if w.get("last_sync"):
        line += f", last sync {fmt_time(float(w['last_sync']))}"
    if w.get("pending"):
        line += f", {w['pending']} pending"
    if "ingested" in w:
        line += f", {w['ingested']} ingested, {w['moved']} moved, {w['removed']} removed"
    if w.get("refused"):
        line += f", {w['refused']} refused in the last sync"
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
    while the vault was locked are caught up at unlock. Writes a [[rag.watch]] table to config.toml
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

    Removes its [[rag.watch]] table from config.toml (comments kept) and applies it at once. Cards
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
def index(vault: Annotated[str, typer.Argument(help="Vault id or name.")]) -> None:
    """Embed every fragment that has no vector yet.

    Repeats budgeted passes until done, also across vault changes. Ends with one line: fragments
    embedded and skipped, the time taken and the rate.
    """
    embedded_total = 0
    started = time.monotonic()
    with _progress_cm("embed") as bar:

        def on_progress(p: dict[str, Any]) -> None:
            if bar is not None:
                eta = p.get("eta_seconds")
                bar.update("embed", int(p["done"]), int(p["total"]), None if eta is None else float(eta))

        idle_changes = 0
        while True:
            out = call("rag.index", {"vault": vault}, progress=on_progress)
            embedded_total += out["embedded"]
            if bar is not None:
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
    report(result, index_summary(embedded_total, skipped, int(out["total"]), seconds))


def index_summary(embedded: int, skipped: int, total: int, seconds: float) -> str:
    """The plain last line of `rag index` (the model's identity hash is in --json only)."""
    took = f"{seconds:.1f} s" if seconds < 90 else duration(seconds)
    rate = f" ({embedded / seconds:,.1f} fragments/s)" if embedded and seconds > 0 else ""
    line = f"Embedded {embedded:,} fragment{'s' if embedded != 1 else ''} in {took}{rate}; skipped {skipped:,}"
    line += " the model cannot embed (still found by bm25)" if skipped else ""
    return line + f". {total - skipped:,} of {total:,} fragments have vectors."


@rag_app.command(
    "ask",
    epilog="""Examples:

\b
  memories rag ask notes "When is the dentist appointment?"
  memories rag ask notes "What did we decide about the roof?" --limit 12
  memories rag ask notes "Summarise my travel plans" --mode bm25 --json""",
)
def ask(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    question: Annotated[str, typer.Argument(help="The question.")],
    mode: Mode = None,
    limit: Annotated[int, typer.Option("--limit", help="How many fragments to send (1-100).")] = 8,
    match_mode: MatchMode = "any",
    no_rerank: NoRerank = False,
    min_score: Annotated[float | None, typer.Option("--min-score", help="Cosine floor below which vector neighbours are not evidence (default [rag] ask_min_cosine, else the model's calibrated floor).")] = None,
) -> None:
    """Answer a question from the vault, citing its sources.

    Sources are cited as [S1], [S2] after the answer.
    The answer comes from the [rag.generation] service set in config.toml, given only the fragments
    found for the question; without evidence it says so instead of guessing.
    """
    params: dict[str, Any] = {"vault": vault, "question": question, "limit": limit, "match_mode": match_mode, "no_rerank": no_rerank}
    if min_score is not None:
        params["min_score"] = min_score
    if mode:
        params["mode"] = mode
    out = call("rag.ask", params)
    if STATE.json:
        emit_json({k: out[k] for k in ("status", "answer", "mode", "citations", "notices") if k in out})
        return
    for n in out.get("notices", []):
        notice(n)
    if out["status"] == "insufficient_evidence":
        print("Insufficient evidence: nothing in the vault matches the question.")
        return
    echo(out["answer"])
    table(
        ["", "TITLE", "RECORD@REV", "BYTES", "SOURCE"],
        [[f"[{c['label']}]", c["title"], f"{c['record_id']}@{c['revision']}", f"{c['start']}-{c['end']}", home_short(c.get("source") or "")] for c in out["citations"]],
    )


@rag_app.command("context")
def context(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What the assistant is about to work on.")],
    budget: Annotated[int | None, typer.Option("--budget", help="Most tokens the pack may use (default [rag] context_budget = 1000).")] = None,
    kind: Kind = None,
    category: Category = None,
    tag: Tag = None,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
    mode: Mode = None,
) -> None:
    """Build a context pack for an assistant, within a token budget.

    The profile and preference facts come first, then the memories most relevant to the query (hybrid
    search by default), each labelled [S1], [S2]... and always whole; a conversation excerpt shows its date and speakers. The filters (--kind, --category, --tag, --since,
    --until, --speaker) apply to every item, profile facts included. Prints plain text ready to paste into a
    prompt; --json gives the items with their token counts and byte ranges (start, end)."""
    params: dict[str, Any] = {"vault": vault, "query": query}
    params.update(_filters(kind, category, tag, since, until, speaker))
    if budget is not None:
        params["budget"] = budget
    if mode:
        params["mode"] = mode
    out = call("rag.context", params)
    if STATE.json:
        emit_json({k: out[k] for k in ("budget", "used_tokens", "tokenizer", "mode", "items", "left_out", "text", "notices") if k in out})
        return
    for n in out.get("notices", []):
        notice(n)
    if not out["items"]:
        notice("nothing to put in the pack: no profile facts, and nothing relevant found")
        return
    sys.stdout.write(safe_text(out["text"], multiline=True))
    counted = "tokens" if out.get("tokenizer") == "model" else "tokens (estimated)"
    left = f"; {out['left_out']} more left out" if out.get("left_out") else ""
    notice(f"{len(out['items'])} items, {out['used_tokens']:,} of {out['budget']:,} {counted}{left}")


@rag_app.command("model-install")
def model_install(
    dir_: Annotated[Path | None, typer.Option("--dir", help="Install here instead of HOME/models/embeddinggemma.")] = None,
) -> None:
    """Download the pinned EmbeddingGemma-300M model.

    About 209 MiB; every file's SHA-256 is verified; files already in place are reused.
    """
    params: dict[str, Any] = {}
    if dir_ is not None:
        params["dir"] = str(dir_.expanduser().absolute())
    with _progress_cm("download") as bar:

        def on_progress(p: dict[str, Any]) -> None:
            if bar is None:
                return
            if "total" in p and "done" in p:
                bar.update(p["file"], int(p["done"]), int(p["total"]))
            elif p.get("status") and not bar.tty:
                sys.stderr.write(f"{p['file']}: {p['status']}\n")

        out = call("rag.model_install", params, progress=on_progress)
    if STATE.json:
        emit_json(out)
        return
    notice(f"model files in {out['dir']}: {out.get('downloaded', 0)} downloaded, {out.get('reused', 0)} reused")
    if out.get("notice"):
        notice(out["notice"])


def memory_search(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    limit: Limit = 10,
    match_mode: MatchMode = "any",
    cards_only: CardsOnly = False,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
) -> None:
    """Lexical search, one line per record.

    Each line shows the title, id@revision, score and a snippet, cut to the terminal's width (100 columns when piped; --json has the whole snippet).
    --since, --until and --speaker narrow it as for `rag search` (with --speaker, the snippet is an
    excerpt by the speaker).
    """
    params: dict[str, Any] = {"vault": vault, "query": query, "limit": limit, "match_mode": match_mode, "cards_only": cards_only}
    params.update(_filters(None, None, None, since, until, speaker))
    out = call("memory.search", params)
    if STATE.json:
        emit_json({"results": out["results"], "ignored_terms": out["ignored_terms"]})
        return
    if not out["results"]:
        notice("nothing found")
        return
    from .memory_cmds import print_record_lines

    print_record_lines(out["results"])


def register(app: typer.Typer) -> None:
    from .memory_cmds import memory_app

    memory_app.command("search")(memory_search)
    app.add_typer(rag_app, name="rag")


__all__ = ["register", "Callable"]
