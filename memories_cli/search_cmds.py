"""`memories rag search`, `rag ask`, `rag context` and `memory search`: what finds things.

Each builds a :class:`memories_cli.formats.Listing` from the daemon's reply; the formats and the
text layout (result blocks) live in :mod:`memories_cli.formats` and :mod:`memories_cli.render`.
The commands are registered on the `rag` and `memory` groups by :mod:`memories_cli.rag_cmds`.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import typer

from .conversation_cmds import titled
from .formats import ColorOpt, FormatOpt, Listing, VerboseOpt, chosen, emit, md_item
from .render import Result, print_results, score_text
from .state import call, echo, notice, safe_text

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

#: Hex characters of a fragment's fingerprint in `--verbose` text (JSON has all 32).
FINGERPRINT_SHOWN = 12

#: CSV columns (item keys) of each listing (``matches``: one hit per document; empty with --fragments).
SEARCH_COLUMNS = ("label", "relevance", "score", "title", "source", "line", "end_line", "matches", "record_id", "revision", "kind", "start", "end", "fingerprint", "text")
#: Documents `rag search --format files` asks for, to print ``--limit`` files when notes without one rank among them.
FILES_ASKED = 100
#: Line ranges shown after "+N more in this file".
MORE_RANGES_SHOWN = 4
MEMORY_COLUMNS = ("id", "revision", "kind", "title", "relevance", "score", "source", "line", "snippet")
CITATION_COLUMNS = ("label", "title", "source", "line", "record_id", "revision", "start", "end")
CONTEXT_COLUMNS = ("label", "block", "kind", "category", "title", "source", "line", "score", "tokens", "record_id", "revision", "start", "end", "text")


def filters(kind: list[str] | None, category: list[str] | None, tag: list[str] | None, since: str | None, until: str | None, speaker: list[str] | None = None) -> dict[str, Any]:
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


def _notices(out: dict[str, Any]) -> None:
    for n in out.get("notices", []):
        notice(n)


def _score_md(r: dict[str, Any]) -> str:
    return score_text(r)


def fragment_result(r: dict[str, Any]) -> Result:
    """A `rag search` result as a block (``--verbose`` details: record@revision, fingerprint, bytes, ranks)."""
    details = [f"record {r['record_id']}@{r['revision']}", f"{r.get('kind') or 'record'}"]
    if r.get("fingerprint"):
        details.append(f"fingerprint {str(r['fingerprint'])[:FINGERPRINT_SHOWN]}")
    details.append(f"bytes {r['start']}-{r['end']}")
    details.append(f"score {r['score']:.4f}")
    for key, name in (("bm25_rank", "bm25 #"), ("vector_rank", "vector #")):
        if r.get(key):
            details.append(f"{name}{r[key]}")
    if r.get("cosine") is not None:
        details.append(f"cosine {r['cosine']:.3f}")
    return Result(
        label=f"[{r['label']}]", title=titled(r), score=score_text(r), source=r.get("source"), line=r.get("line"),
        record=str(r["record_id"]), text=str(r.get("text") or ""), details=tuple(details), more=more_text(r),
    )


def more_text(r: dict[str, Any]) -> str:
    """"+2 more in this file (lines 40-52, 90)" for a document hit with more matching fragments, else ""."""
    more = r.get("more") or 0
    if not isinstance(more, int) or more <= 0:
        return ""
    where = "file" if r.get("source") else {"conversation": "conversation", "fact": "fact"}.get(str(r.get("kind")), "note")
    merged: list[list[int]] = []  # overlapping fragments share lines: their ranges are merged
    for line, end in sorted(
        (span["line"], max(span["line"], span.get("end_line") or span["line"]))
        for span in r.get("more_fragments") or []
        if isinstance(span.get("line"), int)
    ):
        if merged and line <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([line, end])
    ranges = [f"{a}-{b}" if b > a else str(a) for a, b in merged]
    shown = ", ".join(ranges[:MORE_RANGES_SHOWN]) + (", …" if len(ranges) > MORE_RANGES_SHOWN else "")
    lines = f" (line{'s' if len(ranges) > 1 or '-' in shown else ''} {shown})" if shown else ""
    return f"+{more} more in this {where}{lines}"


def print_fragments(out: dict[str, Any], query: str, *, verbose: bool = False) -> None:
    _notices(out)
    if not out["results"]:
        notice("nothing relevant found")
        return
    print_results([fragment_result(r) for r in out["results"]], query, verbose=verbose)
    n = len(out["results"])
    what = ("fragment" if n == 1 else "fragments") if out.get("grouping") == "fragment" else ("result" if n == 1 else "results")
    notice(f"{n} {what} ({out['mode']})")


def search(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    mode: Mode = None,
    match_mode: MatchMode = "any",
    limit: Annotated[int, typer.Option("--limit", help="How many documents (1-100); with --fragments, how many fragments.")] = 10,
    fragments: Annotated[bool, typer.Option("--fragments", help="List the matching fragments themselves, several of one document among them (default: one hit per document, its best fragment).")] = False,
    cards_only: CardsOnly = False,
    no_rerank: NoRerank = False,
    min_score: Annotated[float | None, typer.Option("--min-score", help="Vector/hybrid: the cosine a fragment BM25 did not match needs to be shown (default: [search] min_cosine, else the floor calibrated on this vault for its model); -1 shows the nearest fragments however far.")] = None,
    rrf_k: Annotated[int | None, typer.Option("--rrf-k", help="Reciprocal rank fusion k (default 60).")] = None,
    vector_weight: Annotated[float | None, typer.Option("--vector-weight", help="Hybrid: the vector side's weight, BM25's being 1 (default: the model's measured weight).")] = None,
    fusion: Annotated[Literal["convex", "rrf"] | None, typer.Option("--fusion", help="Hybrid: convex (normalised scores) or rrf (reciprocal ranks); default convex.")] = None,
    kind: Kind = None,
    category: Category = None,
    tag: Tag = None,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
    format_: FormatOpt = None,
    verbose: VerboseOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Search the vault, best first: one hit per document, with citation labels.

    Each result is a document (a file, note, fact or conversation) shown by its best fragment: its
    label ([S1], [S2]...), its relevance (0-100% for vector and hybrid search, else the raw BM25 or
    fusion score), its title, its file and line (or the record id of a note without a file), a few
    lines around the best match, and "+N more in this file" with the lines of its other matching
    fragments; --limit counts documents (--format files --limit 10 prints 10 files, passing over
    notes without a file). --fragments
    lists the fragments themselves instead. --verbose adds the record, revision, fingerprint and
    byte range. The filters (--kind, --category, --tag, --since, --until, --speaker) narrow both the
    lexical and the vector candidates before they are ranked.

    Vector and hybrid search leave out fragments that match neither the query's words nor, above the
    model's relevance floor, its meaning: a query on nothing in the vault says "nothing relevant found"
    (exit 0). --min-score -1 shows the nearest fragments anyway.
    """
    fmt = chosen(format_, color)
    params: dict[str, Any] = {"vault": vault, "query": query, "match_mode": match_mode, "limit": limit, "cards_only": cards_only, "no_rerank": no_rerank}
    if fragments:
        params["fragments"] = True
    elif fmt == "files" and 1 <= limit <= FILES_ASKED:
        params["limit"] = FILES_ASKED  # --limit counts files: notes without one are passed over below
    params.update(filters(kind, category, tag, since, until, speaker))
    for key, value in (("mode", mode), ("min_score", min_score), ("rrf_k", rrf_k), ("vector_weight", vector_weight), ("fusion", fusion)):
        if value is not None:
            params[key] = value
    out = call("rag.search", params)
    if fmt == "files" and not fragments:
        out["results"] = [r for r in out["results"] if r.get("source")][:limit]
    emit(fmt, Listing(
        document={k: out[k] for k in ("mode", "grouping", "results", "ignored_terms", "notices") if k in out},
        items=out["results"],
        columns=SEARCH_COLUMNS,
        text=lambda: print_fragments(out, query, verbose=verbose),
        md_item=lambda r: md_item(r, label=str(r["label"]), extra=" · ".join(p for p in (_score_md(r), more_text(r)) if p), quote=str(r.get("text") or "")),
        notices=out["notices"],
    ))


def memory_search(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    limit: Limit = 10,
    match_mode: MatchMode = "any",
    cards_only: CardsOnly = False,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
    format_: FormatOpt = None,
    verbose: VerboseOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Lexical search, one result per record, best first.

    Each result shows its rank, score, title, file and line (or the record id of a note without a
    file) and a snippet of its best passage; --verbose adds the id@revision. --since, --until and
    --speaker narrow it as for `rag search` (with --speaker, the snippet is an excerpt by the speaker).
    """
    fmt = chosen(format_, color)
    params: dict[str, Any] = {"vault": vault, "query": query, "limit": limit, "match_mode": match_mode, "cards_only": cards_only}
    params.update(filters(None, None, None, since, until, speaker))
    out = call("memory.search", params)

    def text() -> None:
        if not out["results"]:
            notice("nothing found")
            return
        print_results(
            [
                Result(
                    label=f"{i}.", title=titled(r), score=score_text(r), source=r.get("source"), line=r.get("line"),
                    record=str(r["id"]), text=str(r.get("snippet") or ""),
                    details=(f"record {r['id']}@{r['revision']}", str(r.get("kind") or ""), f"score {r['score']:.4f}"),
                )
                for i, r in enumerate(out["results"], start=1)
            ],
            query,
            verbose=verbose,
        )

    emit(fmt, Listing(
        document={"results": out["results"], "ignored_terms": out["ignored_terms"]},
        items=out["results"],
        columns=MEMORY_COLUMNS,
        text=text,
        md_item=lambda r: md_item(r, extra=_score_md(r), quote=str(r.get("snippet") or "")),
    ))


def ask(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    question: Annotated[str, typer.Argument(help="The question.")],
    mode: Mode = None,
    limit: Annotated[int, typer.Option("--limit", help="How many fragments to send (1-100).")] = 8,
    match_mode: MatchMode = "any",
    no_rerank: NoRerank = False,
    min_score: Annotated[float | None, typer.Option("--min-score", help="Cosine floor below which vector neighbours are not evidence (default [search] min_cosine, else the floor calibrated on this vault for its model).")] = None,
    format_: FormatOpt = None,
    verbose: VerboseOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Answer a question from the vault, citing its sources.

    The answer comes first, then its sources [S1], [S2]... with their files and lines.
    The answer comes from the [generation] service set in config.toml, given only the fragments
    found for the question; without evidence it says so instead of guessing. --format jsonl, csv
    and files list the cited sources; md gives the answer and its sources.
    """
    fmt = chosen(format_, color)
    params: dict[str, Any] = {"vault": vault, "question": question, "limit": limit, "match_mode": match_mode, "no_rerank": no_rerank}
    if min_score is not None:
        params["min_score"] = min_score
    if mode:
        params["mode"] = mode
    out = call("rag.ask", params)
    citations = out.get("citations", [])

    def text() -> None:
        _notices(out)
        if out["status"] == "insufficient_evidence":
            print("Insufficient evidence: nothing in the vault matches the question.")
            return
        echo(out["answer"])
        if citations:
            sys.stdout.write("\nSources\n")
            print_results(
                [
                    Result(
                        label=f"[{c['label']}]", title=str(c.get("title") or ""), source=c.get("source"), line=c.get("line"),
                        record=str(c["record_id"]), details=(f"record {c['record_id']}@{c['revision']}", f"bytes {c['start']}-{c['end']}"),
                    )
                    for c in citations
                ],
                question,
                verbose=verbose,
            )

    answered = out["status"] != "insufficient_evidence"
    emit(fmt, Listing(
        document={k: out[k] for k in ("status", "answer", "mode", "citations", "notices") if k in out},
        items=citations,
        columns=CITATION_COLUMNS,
        text=text,
        md_item=lambda c: md_item(c, label=str(c["label"])),
        md_head=(out["answer"] + ("\n\n**Sources**" if citations else "")) if answered else "Insufficient evidence: nothing in the vault matches the question.",
        notices=out.get("notices", []),
    ))


def context(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    query: Annotated[str, typer.Argument(help="What the assistant is about to work on.")],
    budget: Annotated[int | None, typer.Option("--budget", help="Most tokens the pack may use (default [context] budget = 1000).")] = None,
    kind: Kind = None,
    category: Category = None,
    tag: Tag = None,
    since: Since = None,
    until: Until = None,
    speaker: Speaker = None,
    mode: Mode = None,
    rewrite: Annotated[bool | None, typer.Option(
        "--rewrite/--no-rewrite",
        help="Have the [generation] service rewrite the query into a few search queries first, or not "
        "(default [context] rewrite = \"off\"; \"auto\" rewrites whenever the vault's policy allows).",
    )] = None,
    format_: FormatOpt = None,
) -> None:
    """Build a context pack for an assistant, within a token budget.

    The profile and preference facts come first, then the memories most relevant to the query (hybrid
    search by default), each labelled [S1], [S2]... and always whole; a conversation excerpt shows its date and speakers. The filters (--kind, --category, --tag, --since,
    --until, --speaker) apply to every item, profile facts included. Text output is the pack itself,
    ready to paste into a prompt (its size on stderr); --json gives the items with their token counts and
    byte ranges (start, end); jsonl, csv, md and files list the items. With rewriting (--rewrite, or
    [context] rewrite = "auto") only the query goes to the generation service, and the pack holds the
    best of the searches for the query and its rewrites (--json: queries); a failed rewrite only adds a notice."""
    fmt = chosen(format_)
    params: dict[str, Any] = {"vault": vault, "query": query}
    params.update(filters(kind, category, tag, since, until, speaker))
    if budget is not None:
        params["budget"] = budget
    if mode:
        params["mode"] = mode
    if rewrite is not None:
        params["rewrite"] = rewrite
    out = call("rag.context", params)

    def text() -> None:
        _notices(out)
        if not out["items"]:
            notice("nothing to put in the pack: no profile facts, and nothing relevant found")
            return
        sys.stdout.write(safe_text(out["text"], multiline=True))
        counted = "tokens" if out.get("tokenizer") == "model" else "tokens (estimated)"
        left = f"; {out['left_out']} more left out" if out.get("left_out") else ""
        searched = f"; {len(out['queries'])} queries searched" if len(out.get("queries") or ()) > 1 else ""
        notice(f"{len(out['items'])} items, {out['used_tokens']:,} of {out['budget']:,} {counted}{left}{searched}")

    emit(fmt, Listing(
        document={k: out[k] for k in ("budget", "used_tokens", "tokenizer", "mode", "queries", "items", "left_out", "text", "notices") if k in out},
        items=out["items"],
        columns=CONTEXT_COLUMNS,
        text=text,
        md_item=lambda i: md_item(i, label=str(i["label"]), extra=str(i.get("block") or ""), quote=str(i.get("text") or "")),
        notices=out.get("notices", []),
    ))


SEARCH_EPILOG = """Examples:

\b
  memories rag search notes "garden soil"
  memories rag search notes 长城 --mode bm25 --limit 5
  memories rag search notes "trip plan" --kind card --since 2024-01-01 --json
  memories rag search notes "garden" --format files | xargs $EDITOR
  memories rag search notes "garden soil" --fragments --limit 20"""

ASK_EPILOG = """Examples:

\b
  memories rag ask notes "When is the dentist appointment?"
  memories rag ask notes "What did we decide about the roof?" --limit 12
  memories rag ask notes "Summarise my travel plans" --mode bm25 --json"""

MEMORY_SEARCH_EPILOG = """Examples:

\b
  memories memory search notes "dentist"
  memories memory search notes "trip" --since 2024-01-01 --format jsonl"""


__all__ = ["ask", "context", "filters", "memory_search", "search"]
