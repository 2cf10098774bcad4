"""`memories sync ...`: targets of encrypted sync, their state, and sync on demand.

The work happens in each vault's own process (``memoriesd/sync/``); these commands only send the
``sync.*`` requests (docs/protocol.md) and render the replies. A vault syncs only while it is
unlocked, so the commands that take no VAULT cover every unlocked vault that has a target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import UsageError
from memoriesd.text.humanize import ago

from .formats import ColorOpt, Listing, PlainFormatOpt, chosen, emit, md_escape
from .passphrase import unlock_asking
from .state import STATE, call, cli_command, echo, emit_json, notice, read_secret_lines, report

sync_app = typer.Typer(
    help="Sync vaults between devices through a folder or an rclone remote, sealed end to end.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Only this target: its id (t1, see `sync status`) or its text (default: every target).",
    ),
]
OneTargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="The target: its id (t1, see `sync status`) or its text (needed when the vault has several).",
    ),
]

#: The CSV columns of `sync status` (one row per vault and target).
STATUS_COLUMNS = (
    "vault_id",
    "name",
    "target_id",
    "target",
    "last_push",
    "last_pull",
    "pending",
    "devices",
    "conflicts",
    "problems",
    "error",
)
#: The CSV columns of `sync now` (one row per vault and target).
NOW_COLUMNS = (
    "vault_id",
    "name",
    "target_id",
    "target",
    "received",
    "applied",
    "conflicts",
    "forgotten",
    "pushed",
    "segments",
    "error",
)


def _synced_vaults(vault: str | None) -> list[str]:
    """The vault named, or every unlocked vault that syncs (from one ``vault.overview``: its rows
    carry a ``sync`` summary; a vault process too busy to answer in time is kept, to be asked)."""
    if vault is not None:
        return [vault]
    rows = call("vault.overview")["vaults"]
    return [
        str(v["vault_id"]) for v in rows if not v.get("locked", True) and (v.get("sync") or v.get("busy"))
    ]


def _device_word(d: dict[str, Any]) -> str:
    return f"{d['label']} ({d['device']})" if d.get("label") else str(d["device"])


def _status_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (csv, jsonl): one per vault and target."""
    rows = []
    for v in doc["vaults"]:
        for t in v["targets"]:
            rows.append(
                {
                    "vault_id": v["vault_id"],
                    "name": v["name"],
                    "device": v.get("device"),
                    "target_id": t["id"],
                    "target": t["target"],
                    "last_push": t.get("last_push"),
                    "last_pull": t.get("last_pull"),
                    "pending": t.get("pending"),
                    "devices": [_device_word(d) for d in t.get("devices", [])],
                    "conflicts": len(v.get("conflicts", [])),
                    "problems": t.get("problems", []),
                    "error": t.get("error"),
                }
            )
    return rows


def _print_status(v: dict[str, Any]) -> None:
    me = _device_word({"device": v.get("device") or "?", "label": v.get("label")})
    echo(f"Vault {v['name']} ({v['vault_id']}), this device {me}")
    for t in v["targets"]:
        echo(f"  {t['id']}  {t['target']}")
        echo(
            f"    last push {ago(t.get('last_push'))}, last pull {ago(t.get('last_pull'))}, "
            f"pending {t.get('pending', 0):,}, epoch {t.get('epoch', 0)}"
        )
        if t.get("activity") and t["activity"] != "idle":
            echo(f"    now: {t['activity']}")
        devices = t.get("devices") or []
        if not devices:
            echo("    other devices: none seen yet")
        for d in devices:
            echo(f"    device {_device_word(d)}: last seen {ago(d.get('last_seen'))}")
        for p in t.get("problems") or []:
            echo(f"    problem: {p}")
        if t.get("error"):
            echo(f"    error: {t['error']}")
    conflicts = v.get("conflicts") or []
    if conflicts:
        shown = ", ".join(conflicts[:5]) + (f" and {len(conflicts) - 5:,} more" if len(conflicts) > 5 else "")
        echo(f"  conflicts: {len(conflicts):,} record(s) with concurrent versions: {shown}")
        echo(
            f"    (`{cli_command('memory', 'history', str(v['name']), 'ID')}` shows both; an edit resolves it)"
        )
    else:
        echo("  conflicts: none")


def _md_status(row: dict[str, Any]) -> str:
    line = f"- **{md_escape(str(row['name']))}** `{row['target_id']}` {md_escape(str(row['target']))}: "
    line += f"last push {ago(row.get('last_push'))}, last pull {ago(row.get('last_pull'))}, pending {row.get('pending') or 0}"
    if row.get("error"):
        line += f", error: {md_escape(str(row['error']))}"
    return line


@sync_app.command("add")
def add(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    target: Annotated[
        str, typer.Argument(help="A folder (/path, ~/path; created when missing) or rclone:REMOTE:PATH.")
    ],
) -> None:
    """Sync a vault with a folder or an rclone remote path.

    Only sealed files go there: the vault's wrapped key and sealed segments under names that say
    nothing. A folder suits any folder-sync tool (Syncthing, Dropbox, iCloud Drive, Nextcloud);
    rclone:REMOTE:PATH runs your `rclone` for S3, B2, WebDAV, SFTP and the rest. The first sync
    starts at once in the background; then the vault syncs after each change and on unlock. A
    device-only vault is refused, and so is a target that holds another vault. On another device:
    `memories vault join TARGET`.
    """
    out = call("sync.add", {"vault": vault, "target": target})
    report(
        out,
        f"Vault {vault} syncs with {out['target']} ({out['target_id']}); the first sync runs in the background: "
        f"`{cli_command('sync', 'status', vault)}` shows it, `{cli_command('vault', 'join', out['target'])}` joins it on another device.",
    )


@sync_app.command("status")
def status(
    vault: Annotated[
        str | None, typer.Argument(help="Vault id or name (default: every unlocked vault that syncs).")
    ] = None,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Each target of the vaults that sync: last push and pull, pending changes, devices, problems.

    Per target: when this device last pushed and pulled, how many of its changes are not on the
    target yet, the other devices seen there (with when they were last active), what the target
    holds that was refused (one line each) and the last error. Then the records with concurrent
    versions (conflicts) kept from a merge. A locked vault does not sync and is not shown.
    """
    fmt = chosen(format_, color)
    vaults = []
    for ref in _synced_vaults(vault):
        out = call("sync.status", {"vault": ref})
        if out["targets"] or vault is not None:
            vaults.append(out)
    doc = {"vaults": vaults}

    def text() -> None:
        shown = [v for v in vaults if v["targets"]]
        for v in vaults:
            if not v["targets"]:
                notice(
                    f"Vault {v['name']} does not sync: add a target with `{cli_command('sync', 'add', str(v['name']), 'TARGET')}`."
                )
        if not vaults:
            notice(
                f"No unlocked vault syncs: add a target with `{cli_command('sync', 'add', 'VAULT', 'TARGET')}` (a locked vault does not sync)."
            )
        for i, v in enumerate(shown):
            if i:
                print()
            _print_status(v)

    emit(
        fmt,
        Listing(document=doc, items=_status_rows(doc), columns=STATUS_COLUMNS, text=text, md_item=_md_status),
    )


def _now_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for out in runs:
        targets = {t["id"]: t["target"] for t in out.get("targets", [])}
        for tid, r in out["results"].items():
            rows.append(
                {
                    "vault_id": out["vault_id"],
                    "name": out.get("name"),
                    "target_id": tid,
                    "target": targets.get(tid, tid),
                    **r,
                }
            )
    return rows


def _now_line(row: dict[str, Any]) -> str:
    head = f"{row['name']} → {row['target']}"
    if row.get("error"):
        return f"{head}: error: {row['error']}"
    parts = [
        f"received {row.get('received', 0):,} (applied {row.get('applied', 0):,})",
        f"pushed {row.get('pushed', 0):,}",
    ]
    if row.get("conflicts"):
        parts.append(f"{row['conflicts']:,} new conflict(s)")
    if row.get("forgotten"):
        parts.append(f"{row['forgotten']:,} forgotten")
    if row.get("header_adopted"):
        parts.append("passphrase change adopted")
    return f"{head}: " + ", ".join(parts)


@sync_app.command("now")
def now(
    vault: Annotated[
        str | None, typer.Argument(help="Vault id or name (default: every unlocked vault that syncs).")
    ] = None,
    target: TargetOpt = None,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Sync now: pull from and push to every target, and wait for it.

    Prints, per target, the changes received and applied and those pushed, or the target's error;
    the exit code is 1 when a target failed (the others still synced).
    """
    fmt = chosen(format_, color)
    if target is not None and vault is None:
        raise UsageError("--target needs a VAULT: name the vault the target belongs to")
    refs = _synced_vaults(vault)
    runs = []
    for ref in refs:
        params: dict[str, Any] = {"vault": ref}
        if target is not None:
            params["target"] = target
        runs.append(call("sync.now", params))
    if not runs:
        raise UsageError(
            f"no unlocked vault syncs: add a target with `{cli_command('sync', 'add', 'VAULT', 'TARGET')}`"
        )
    rows = _now_rows(runs)

    def text() -> None:
        for row in rows:
            echo(_now_line(row))

    emit(
        fmt,
        Listing(
            document={"vaults": runs},
            items=rows,
            columns=NOW_COLUMNS,
            text=text,
            md_item=lambda r: "- " + md_escape(_now_line(r)),
        ),
    )
    if any(r.get("error") for r in rows):
        raise typer.Exit(1)


@sync_app.command("remove")
def remove(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    target: Annotated[str, typer.Argument(help="The target: its id (t1, see `sync status`) or its text.")],
) -> None:
    """Stop syncing a vault with a target; the files on the target are left as they are.

    Other devices that sync with the target go on. Delete the target's files yourself when no
    device uses it any more (they are sealed: nobody without the vault's key reads them).
    """
    out = call("sync.remove", {"vault": vault, "target": target})
    report(out, f"Vault {vault} no longer syncs with {out['removed']}; the files there are left as they are.")


@sync_app.command("compact")
def compact(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    target: OneTargetOpt = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Compact even if a device seen in the last 30 days has not applied the last forget.",
        ),
    ] = False,
) -> None:
    """Rewrite a target without what was forgotten: a new epoch of sealed base segments.

    `memory forget` removes content from every device as they sync; its sealed bytes stay in the
    target's old segments until a compaction rewrites the target. That happens by itself once
    every device seen in the last 30 days has applied the forget; this command does it now, and
    refuses (usage) while a device has not, unless --force (a device that missed the forget
    forgets it when it next syncs). Copies a sync tool or a backup made earlier are not reached.
    """
    params: dict[str, Any] = {"vault": vault, "force": force}
    if target is not None:
        params["target"] = target
    out = call("sync.compact", params)
    report(
        out,
        f"Compacted: epoch {out.get('epoch')}, {out.get('base_segments', 0):,} base segment(s) written, "
        f"{out.get('files_removed', 0):,} old file(s) removed from the target.",
    )


@sync_app.command("forget-device")
def forget_device(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    device: Annotated[str, typer.Argument(help="The device's id or label (see `sync status`).")],
    target: OneTargetOpt = None,
) -> None:
    """Stop listing a device on a target (a lost or retired machine).

    Its tip file is deleted and it no longer holds back compaction. Limits: a device that had the
    key had the data; it keeps what it synced, and while the vault's key is the same it can still
    read and write the target (it shows again if it syncs). To shut it out of new data, change the
    key with `memories vault passwd VAULT --rekey` after this (the other devices then need the new
    passphrase).
    """
    params: dict[str, Any] = {"vault": vault, "device": device}
    if target is not None:
        params["target"] = target
    out = call("sync.forget_device", params)
    if STATE.json:
        emit_json(out)
        return
    notice(
        f"Forgot device {', '.join(out['forgotten_devices'])} on the target. It keeps what it synced and, while the key is "
        f"the same, can still use the target: `{cli_command('vault', 'passwd', vault, '--rekey')}` shuts it out of new data."
    )


@sync_app.command("adopt-key")
def adopt_key(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    passphrase_stdin: Annotated[bool, typer.Option("--passphrase-stdin", help="Read the new passphrase from the first line of stdin.")] = False,
    passphrase_file: Annotated[Path | None, typer.Option("--passphrase-file", help="Read the new passphrase from the first line of this file.")] = None,
) -> None:
    """Take the key another device changed to (`vault passwd --rekey` there).

    `sync status` says when it is needed: the target is sealed under a key this device does not
    have. Type the vault's new passphrase (the one chosen with --rekey): this device's copy is
    sealed again under the new key, keeps everything written here meanwhile, and syncs on. From
    then on the old passphrase opens nothing here either.
    """
    params: dict[str, Any] = {"vault": vault}
    if passphrase_stdin or passphrase_file:
        params["passphrase"] = read_secret_lines(passphrase_stdin, passphrase_file, 1)[0]
        out = call("sync.adopt_key", params)
    else:
        out = unlock_asking(params, "sync.adopt_key")
    if STATE.json:
        emit_json(out)
        return
    notice(f"Vault {vault} now has the new key; it syncs on with the new passphrase.")


__all__ = ["sync_app"]
