"""`memories memory extract`: facts (and with a model, a summary) from a captured conversation."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError

from .state import STATE, call, echo, emit_json, notice, table

EXTRACT_HELP = """Extract facts from a captured conversation.

Preferences, decisions, habits, actions and other facts, each remembered as a fact (as `memory remember` does: an exact repeat changes nothing, the
same key revises) that keeps a link to the conversation and the turns it came from (meta "from").

With a [generation] service configured (and allowed by the vault's device-only policy), the model
reads the transcript as untrusted data and must reply with strict JSON: a 2-3 sentence summary (stored
on the conversation, searchable) and items that cite existing turns; a malformed reply is rejected and
nothing is written. At most the last 6,000 tokens of a long transcript are sent (a notice says so).
Without one, or with --patterns, pattern rules find plain first-person statements ("I prefer ...",
"I decided to ...", "I always/usually/never ...", and the same in French, Chinese and Japanese) in the
people's turns, never an assistant's. The output says which path ran.

This runs after `memory capture` too, unless --no-extract or the vault's policy is off
(`memories vault policy VAULT --no-extract`); this command extracts whatever that policy says.
A private conversation is never extracted.
"""


def extract(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    record_id: Annotated[str, typer.Argument(help="The conversation record's id (see `memories memory capture`).")],
    patterns: Annotated[bool, typer.Option("--patterns", help="Use the pattern rules, not the model.")] = False,
    model: Annotated[bool, typer.Option("--model", help="Use the model; an error when none is configured or allowed.")] = False,
) -> None:
    if patterns and model:
        raise UsageError("--patterns and --model exclude each other: give one (without either, the model when available)")
    path = "patterns" if patterns else "model" if model else "auto"
    out = call("memory.extract", {"vault": vault, "record": record_id, "path": path})
    if STATE.json:
        emit_json(out)
        return
    render(out)


extract.__doc__ = EXTRACT_HELP


def render(out: dict[str, Any]) -> None:
    """Human output of an extraction: the summary, the facts table, then notices and a count line."""
    if out.get("summary"):
        echo(str(out["summary"]))
    facts = out.get("facts") or []
    if facts:
        table(
            ["ACTION", "ID", "CATEGORY", "KEY", "TURNS", "TEXT"],
            [[f["action"], f["id"], f["category"], f.get("key") or "", ",".join(f.get("turns") or []), f.get("text", "")] for f in facts],
        )
    for n in out.get("notices") or []:
        notice(n)
    counts = {a: sum(1 for f in facts if f["action"] == a) for a in ("added", "updated", "unchanged")}
    done = ", ".join(f"{n} {a}" for a, n in counts.items() if n) or "none"
    rejected = f", {out['rejected']} rejected" if out.get("rejected") else ""
    notice(f"Extraction ({out['path']}): {len(facts)} fact(s): {done}{rejected}.")


def register(app: typer.Typer) -> None:
    """`memory extract` in the `memory` group."""
    from .memory_cmds import memory_app

    memory_app.command("extract")(extract)


__all__ = ["register", "render"]
