"""The MCP tools that write to the vault: memory_remember, memory_capture and memory_forget.

Each is one daemon method on the grant's connection (:mod:`memories_cli.mcp_server`), so the daemon
enforces its scope (``remember``, ``capture``, ``forget``/``forget-all``: never defaults), the vault,
expiry, revocation and lock, and re-checks the grant under the store lock right before its commit.
Kept apart from the reading tools only to keep each module small.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, Field

from memoriesd.errors import UsageError

#: ``run(tool, method, params, idempotent=...)`` of :func:`memories_cli.mcp_server.build_server`;
#: ``params`` may be a function that builds them (a ``UsageError`` it raises is the tool's error).
Run = Callable[..., Awaitable[CallToolResult]]

#: Most characters of a conversation handed over at once (the daemon's frame limit is 16 MiB).
MAX_TRANSCRIPT_CHARS = 4_000_000
MAX_MESSAGES = 20_000


# ---------------------------------------------------------------------------- rendering


def _render_remember(out: dict[str, Any]) -> str:
    head = f"{out['action']}: fact id={out['id']} revision={out['revision']} category={out['category']}"
    lines = [head + (f" key={out['key']}" if out.get("key") else "")]
    prev = out.get("previous")
    if out["action"] == "updated" and isinstance(prev, dict):
        lines.append(f"it revised revision {prev.get('revision')}" + (f", which said: {prev['text']}" if "text" in prev else ""))
    elif out["action"] == "unchanged":
        lines.append("the fact already said this: nothing was written")
    lines += [f"notice: {n}" for n in out.get("notices") or []]
    return "\n".join(lines)


def _render_forget(out: dict[str, Any]) -> str:
    n = len(out["records"])
    if out["dry_run"]:
        lines = [f"dry run: {n} records would be forgotten (nothing was changed):"]
    else:
        lines = [f"forgot {out['forgotten']} records and {out['revisions_removed']} revisions, for good:"]
    for r in out["records"]:
        desc = f"- id={r['id']} kind={r['kind']}" + (f" category={r['category']}" if r.get("category") else "")
        desc += f" revisions={r['revisions']} match={r['match']}"
        if r.get("title") or r.get("text"):
            desc += f" text: {r.get('title') or r.get('text')}"
        lines.append(desc)
    passed, total = out.get("passed_over") or [], int(out.get("passed_over_total") or 0)
    if total:
        kinds = sorted({r["kind"] for r in passed})
        lines.append(
            f"{'nothing was chosen: ' if not n else ''}{total} records on the topic were passed over and kept: a query "
            f"chooses only {' and '.join(out.get('kinds') or ())} records. To forget one of these, call memory_forget "
            f"again with kind {' or '.join(kinds)} (or with its ids), once the person confirms it is what they meant:"
        )
        for r in passed:
            desc = f"- id={r['id']} kind={r['kind']} match={r.get('match')}"
            if r.get("title") or r.get("text"):
                desc += f" text: {r.get('title') or r.get('text')}"
            lines.append(desc)
    lines += [f"notice: {m}" for m in out.get("notices") or []]
    return "\n".join(lines)


def _render_capture(out: dict[str, Any]) -> str:
    records = out["records"]
    lines = [f"{len(records)} conversation records (format {out.get('format')}):"]
    for r in records:
        desc = f"- {r['status']}: id={r['id']} revision={r['revision']} turns={r.get('turns')}"
        desc += "".join(f" {k}={r[k]}" for k in ("date", "session_id") if r.get(k))
        if r.get("title"):
            desc += f" title: {r['title']}"
        lines.append(desc)
    if any(r["status"] == "unchanged" for r in records):
        lines.append("unchanged: that session was already filed with the same turns; nothing was written")
    extraction = out.get("extraction")
    if isinstance(extraction, dict) and extraction:
        lines.append("extraction: " + " ".join(f"{k}={v}" for k, v in extraction.items()))
    return "\n".join(lines)


def _pick(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: d.get(k) for k in keys}


REMEMBER_KEYS = ("action", "id", "revision", "category", "key", "previous")
FORGOTTEN_ITEM = ("id", "kind", "category", "revisions", "match", "title", "text")
CAPTURED_ITEM = ("id", "revision", "status", "title", "session_id", "date", "turns")
WRITE_TOOLS = ("memory_remember", "memory_capture", "memory_forget")


def shape_write(tool: str, out: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The text and structured content of a write tool's result (the caller adds the data notice)."""
    if tool == "memory_remember":
        data = _pick(out, REMEMBER_KEYS)
        data["notices"] = list(out.get("notices") or [])
        return _render_remember(data), data
    if tool == "memory_capture":
        extraction = out.get("extraction")
        data = {
            "format": out.get("format"),
            "records": [_pick(r, CAPTURED_ITEM) for r in out.get("records", [])],
            "extraction": dict(extraction) if isinstance(extraction, dict) else None,
        }
        return _render_capture(data), data
    data = {
        "dry_run": bool(out.get("dry_run")),
        "records": [{k: r[k] for k in FORGOTTEN_ITEM if k in r} for r in out.get("records", [])],
        "forgotten": out.get("forgotten", 0),
        "revisions_removed": out.get("revisions_removed", 0),
        "notices": list(out.get("notices") or []),
    }
    if "passed_over" in out:
        data["kinds"] = list(out.get("kinds") or [])
        data["passed_over"] = [{k: r[k] for k in FORGOTTEN_ITEM if k in r} for r in out.get("passed_over") or []]
        data["passed_over_total"] = int(out.get("passed_over_total") or 0)
    return _render_forget(data), data


# ---------------------------------------------------------------------------- parameters


# Tool parameter types (module level: the SDK evaluates the annotations in this module's globals).
FactText = Annotated[
    str,
    Field(min_length=3, max_length=500, description="The fact, one short self-contained sentence (3-500 characters)."),
]
Category = Annotated[
    Literal["profile", "preference", "decision", "pattern", "fact"],
    Field(description="profile (who the person is), preference, decision, pattern (a habit) or fact (default)."),
]
FactKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=200,
        description="What the fact is about, e.g. indentation: a later fact with the same key and category revises it.",
    ),
]
Importance = Annotated[
    float | None, Field(ge=0.0, le=1.0, description="0 to 1 (default 0.5): more important profile facts come first.")
]
ForgetQuery = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=2000,
        description="What the facts or conversations to forget say, e.g. the fact as it was remembered (with scope "
        "specific or topic). Notes and cards are not chosen unless kind names them.",
    ),
]
ForgetScope = Annotated[
    Literal["specific", "topic", "all"],
    Field(
        description="specific: the fact query restates, else the one record that best matches it (default); topic: "
        "every fact and conversation on the query's topic; all: every fact (with kind: every record of that kind; "
        "needs the grant scope forget-all)."
    ),
]
ForgetIds = Annotated[
    list[str] | None,
    Field(min_length=1, max_length=100, description="Instead of a query: the record ids to forget (e.g. from memory_search)."),
]
ForgetKind = Annotated[
    Literal["memory", "card", "fact", "conversation"] | None,
    Field(
        description="With a query: choose only records of this kind (default: facts and conversations; card, an "
        "ingested file, or memory, a note, only when the person asked to forget that note or file). With scope all: "
        "forget every record of this kind."
    ),
]
DryRun = Annotated[bool, Field(description="Only list what would be forgotten; nothing changes.")]


class ChatMessage(BaseModel):
    """One message of the conversation, in order."""

    role: Annotated[
        str, Field(min_length=1, max_length=100, description="Who said it: user, assistant, or a person's name.")
    ]
    content: Annotated[str, Field(min_length=1, max_length=MAX_TRANSCRIPT_CHARS, description="What was said (plain text).")]
    timestamp: Annotated[
        str | None, Field(default=None, max_length=40, description="When it was said (ISO 8601), if known.")
    ] = None


Messages = Annotated[
    list[ChatMessage] | None,
    Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description="The conversation as messages {role, content, timestamp?}, in order. Give this or text.",
    ),
]
Transcript = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_TRANSCRIPT_CHARS,
        description="Instead of messages: the whole transcript as text (JSON Lines of chat messages, a Markdown "
        "`Speaker: text` transcript, or LoCoMo JSON); see format.",
    ),
]
Format = Annotated[
    Literal["auto", "jsonl", "markdown", "locomo"],
    Field(description="How to read text: auto (default: detected), jsonl, markdown or locomo."),
]
Title = Annotated[
    str | None, Field(min_length=1, max_length=1000, description="A title (default: one made from the speakers and date).")
]
SessionDate = Annotated[
    str | None,
    Field(min_length=1, max_length=40, description="When the conversation took place: an ISO date or date-time."),
]
SessionId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=200,
        description="A stable id of this conversation: filing it again with more messages makes a new revision.",
    ),
]


def capture_params(
    messages: list[ChatMessage] | None,
    text: str | None,
    fmt: str,
    title: str | None,
    date: str | None,
    session_id: str | None,
) -> dict[str, Any]:
    """``memory.capture`` params: ``messages`` become JSON Lines of chat messages (format jsonl)."""
    if (messages is None) == (text is None):
        raise UsageError("give the conversation either as messages or as text (with format), not both")
    if messages is not None:
        if fmt not in ("auto", "jsonl"):
            raise UsageError(f"format {fmt} reads text: drop format, or give the transcript as text")
        lines = []
        for m in messages:
            row: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.timestamp is not None:
                row["timestamp"] = m.timestamp
            lines.append(json.dumps(row, ensure_ascii=False))
        text, fmt = "\n".join(lines) + "\n", "jsonl"
        if len(text) > MAX_TRANSCRIPT_CHARS:
            raise UsageError(f"the conversation is over {MAX_TRANSCRIPT_CHARS:,} characters: file it in parts, each with its own session_id")
    return {"text": text, "format": fmt, "title": title, "date": date, "session_id": session_id}


# ---------------------------------------------------------------------------- tools


def register_write_tools(server: MCPServer, run: Run) -> None:
    """Add memory_remember, memory_capture and memory_forget to ``server``."""
    adds = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    removes = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

    @server.tool(
        name="memory_remember",
        title="Remember a fact about the person",
        description="Save one short, durable fact about the person: who they are (profile), what they prefer "
        "(preference), what they decided (decision), how they usually work (pattern), or another fact. Call it "
        "when the person tells you something about themselves that will still matter in later conversations, or "
        "asks you to remember it. Write it as a self-contained sentence about the user. When a fact changes, save "
        "the new state ('the user switched to spaces'): a fact with the same key, or the same meaning, as a saved "
        "fact of its category becomes a new revision of it (action updated), and an exact repeat changes nothing "
        "(action unchanged). Never save secrets (passwords, keys, tokens, account or card numbers) or one-off "
        "details of the current task. It only adds or revises facts: it cannot edit or delete anything else. "
        "Needs the grant scope `remember`.",
        annotations=adds,
    )
    async def memory_remember(
        text: FactText,
        category: Category = "fact",
        key: FactKey = None,
        importance: Importance = None,
    ) -> CallToolResult:
        return await run(
            "memory_remember", "memory.remember", {"text": text, "category": category, "key": key, "importance": importance}
        )

    @server.tool(
        name="memory_capture",
        title="File this conversation",
        description="File a conversation you just had with the person (or a transcript they hand you) in their "
        "vault, so later searches and context packs can recall what was said, by whom and when. Give the messages "
        "in order as {role, content, timestamp?}, or the whole transcript as text with its format. Give date (when "
        "it took place) and, for a conversation that goes on, a stable session_id: filing the same session again "
        "changes nothing, and filing it with more messages makes a new revision. Leave out secrets (passwords, "
        "keys, tokens) before filing. The vault's owner decides whether facts are then extracted from it. It only "
        "adds conversations: it cannot edit or delete anything else. Needs the grant scope `capture`.",
        annotations=adds,
    )
    async def memory_capture(
        messages: Messages = None,
        text: Transcript = None,
        format: Format = "auto",
        title: Title = None,
        date: SessionDate = None,
        session_id: SessionId = None,
    ) -> CallToolResult:
        return await run(
            "memory_capture", "memory.capture", lambda: capture_params(messages, text, format, title, date, session_id)
        )

    @server.tool(
        name="memory_forget",
        title="Forget for real",
        description="Forget records for good, only when the person asks you to: every revision of them and "
        "everything derived from them leaves the vault, and nothing can bring them back. A query chooses among facts "
        "and conversations only (what was remembered or said), never the person's notes or ingested cards unless kind "
        "names them (card or memory) or ids name them: the reply lists records on the topic it passed over. scope "
        "specific forgets the fact the query restates, else the one record that best matches it; topic every fact "
        "and conversation on the query's topic; all every fact (with kind: every record of that kind; needs the "
        "grant scope `forget-all`); or give ids instead of a query. First call it with dry_run true and show the "
        "person what would go; forget once they confirm. Needs the grant scope `forget`.",
        annotations=removes,
    )
    async def memory_forget(
        query: ForgetQuery = None,
        scope: ForgetScope = "specific",
        ids: ForgetIds = None,
        kind: ForgetKind = None,
        dry_run: DryRun = False,
    ) -> CallToolResult:
        params: dict[str, Any] = {"ids": ids, "query": query, "kind": kind, "dry_run": dry_run}
        if scope == "all":
            params["all"] = True
        else:
            params["scope"] = scope
        return await run("memory_forget", "memory.forget", params, idempotent=False)


__all__ = ["ChatMessage", "WRITE_TOOLS", "capture_params", "register_write_tools", "shape_write"]
