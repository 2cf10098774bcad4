"""`memories status`: every vault at a glance, in one request to the daemon (``vault.overview``).

Each vault's name and id, locked or unlocked, its records, the lexical index and the embedding
progress, the time left before auto-lock and its grant count. The router asks every unlocked vault's
process at once and answers for the locked ones itself; nothing of a vault's text is in the reply.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memoriesd.text.humanize import ago, duration

from .formats import ColorOpt, Listing, PlainFormatOpt, chosen, emit, md_escape
from .state import call, cli_command, notice, table

#: The CSV columns (and the order of ``--format jsonl`` keys that matter to a script).
COLUMNS = (
    "vault_id",
    "name",
    "locked",
    "records",
    "fragments",
    "embedded",
    "total",
    "embedding",
    "auto_lock_seconds",
    "grants",
    "sync_targets",
    "last_sync",
    "sync_errors",
)


def _flat(v: dict[str, Any]) -> dict[str, Any]:
    """A row for csv and jsonl: the embedding progress as plain columns."""
    emb = v.get("embedding") or {}
    row = {
        k: v.get(k)
        for k in ("vault_id", "name", "locked", "records", "fragments", "auto_lock_seconds", "grants")
    }
    row.update({"embedded": emb.get("embedded"), "total": emb.get("total"), "embedding": emb.get("state")})
    sync = v.get("sync") or {}
    row.update({"sync_targets": sync.get("targets"), "last_sync": sync.get("last_sync"), "sync_errors": sync.get("errors")})
    for extra in ("corrupt", "busy", "index"):
        if extra in v:
            row[extra] = v[extra]
    return row


def state_word(v: dict[str, Any]) -> str:
    if v.get("corrupt"):
        return "corrupt"
    if v.get("busy"):
        return "unlocked (busy)"
    return "locked" if v.get("locked", True) else "unlocked"


def embedding_text(v: dict[str, Any]) -> str:
    """``1,200/3,400 (35%), running, about 4 min left``; ``done``; ``no model``; "" when locked."""
    emb = v.get("embedding")
    if v.get("locked", True) or not isinstance(emb, dict):
        return ""
    if not emb.get("available"):
        return "no model"
    done, total = emb.get("embedded"), emb.get("total")
    state = str(emb.get("state") or "")
    if done is None or not total:
        return state if state not in ("", "idle") else "not loaded"
    text = f"{done:,}/{total:,} ({100 * done / total:.0f}%)"
    if state and state != "idle":
        text += f", {state}"
    if emb.get("eta_seconds"):
        text += f", about {duration(float(emb['eta_seconds']))} left"
    return text


def sync_text(v: dict[str, Any]) -> str:
    """``synced 2 min ago``, ``never synced``, ``error`` (see `sync status`); "" when it does not sync."""
    info = v.get("sync")
    if v.get("locked", True) or not isinstance(info, dict):
        return ""
    if info.get("errors"):
        return "error: see sync status"
    text = "never synced" if not info.get("last_sync") else f"synced {ago(info['last_sync'])}"
    return text + (f", {info['problems']} problem(s)" if info.get("problems") else "")


def _auto_lock(v: dict[str, Any]) -> str:
    if v.get("locked", True):
        return ""
    left = v.get("auto_lock_seconds")
    return "off" if left is None else f"in {duration(float(left))}"


def _count(v: dict[str, Any], key: str) -> str:
    value = v.get(key)
    return "" if value is None or v.get("locked", True) else f"{int(value):,}"


def _md(row: dict[str, Any]) -> str:
    """A Markdown item from a flat row (see :func:`_flat`)."""
    line = f"- **{md_escape(str(row['name']))}** `{row['vault_id']}`: {state_word(row)}"
    if not row.get("locked", True):
        line += f", {_count(row, 'records')} records"
        if row.get("total"):
            line += f", {row.get('embedded') or 0:,}/{row['total']:,} embedded"
        line += f", auto-lock {_auto_lock(row)}"
    return line


def status(
    vault: Annotated[
        str | None, typer.Argument(help="Only this vault (id or name); default: every vault.")
    ] = None,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Every vault at a glance: locked or unlocked, records, index and embedding progress, auto-lock, grants.

    One request to the daemon; a locked vault shows its name and id only (its content is sealed).
    A SYNC column appears when a vault syncs: when it last pulled from every target, or an error
    (`memories sync status` has the details).
    """
    fmt = chosen(format_, color)
    out = call("vault.overview", {"vault": vault} if vault else {})
    rows: list[dict[str, Any]] = out["vaults"]

    def text() -> None:
        if not rows:
            notice(f"There are no vaults yet: create one with `{cli_command('vault', 'create', 'NAME')}`.")
            return
        synced = any(v.get("sync") for v in rows)  # the SYNC column only where a vault syncs
        table(
            ["NAME", "VAULT_ID", "STATE", "RECORDS", "FRAGMENTS", "EMBEDDING", "AUTO-LOCK", "GRANTS"] + (["SYNC"] if synced else []),
            [
                [
                    v["name"],
                    v["vault_id"],
                    state_word(v),
                    _count(v, "records"),
                    _count(v, "fragments"),
                    embedding_text(v),
                    _auto_lock(v),
                    _count(v, "grants"),
                ]
                + ([sync_text(v)] if synced else [])
                for v in rows
            ],
        )
        locked = [v for v in rows if v.get("locked", True) and not v.get("corrupt")]
        if locked and len(locked) == len(rows):
            notice(
                f"Every vault is locked: `{cli_command('vault', 'unlock', str(locked[0]['name']))}` opens one."
            )

    emit(fmt, Listing(document=out, items=[_flat(v) for v in rows], columns=COLUMNS, text=text, md_item=_md))


def register(app: typer.Typer) -> None:
    app.command("status")(status)


__all__ = ["register", "status", "embedding_text", "state_word", "sync_text"]
