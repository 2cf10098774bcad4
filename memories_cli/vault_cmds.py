"""`memories vault ...` and `memories daemon ...`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from memoriesd.errors import DaemonUnreachable, MemoriesError, UsageError

from .formats import ColorOpt, Listing, PlainFormatOpt, chosen, emit
from .passphrase import checked_new, unlock_asking
from .state import (
    STATE,
    call,
    cli_command,
    client,
    confirm,
    emit_json,
    fmt_time,
    notice,
    prompt_secret,
    read_secret_lines,
    report,
    table,
)

vault_app = typer.Typer(help="Create, unlock, lock and manage encrypted vaults.", no_args_is_help=True, rich_markup_mode=None)
daemon_app = typer.Typer(help="Start, stop, restart and inspect the memoriesd daemon.", no_args_is_help=True, rich_markup_mode=None)

PassStdin = Annotated[bool, typer.Option("--passphrase-stdin", help="Read the passphrase from the first line of stdin.")]
PassFile = Annotated[Path | None, typer.Option("--passphrase-file", help="Read the passphrase from the first line of this file.")]


def _one_passphrase(stdin: bool, path: Path | None, *, confirm: bool) -> str:
    if stdin or path is not None:
        return read_secret_lines(stdin, path, 1)[0]
    return prompt_secret("Passphrase: ", confirm=confirm)


@vault_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A name for the vault (readable while locked).")],
    passphrase_stdin: PassStdin = False,
    passphrase_file: PassFile = None,
    remember: Annotated[bool, typer.Option("--remember", help="Keep the unlock secret in the OS keyring.")] = False,
    device_only: Annotated[
        bool, typer.Option("--device-only", help="Never send this vault's text to a non-loopback service.")
    ] = False,
) -> None:
    """Create a vault and leave it unlocked. Prints the new VAULT_ID alone on the last line."""
    if not (passphrase_stdin or passphrase_file):
        notice("A lost passphrase means lost data: nobody can recover this vault without it.")
    pw = _one_passphrase(passphrase_stdin, passphrase_file, confirm=True)
    interactive = not (passphrase_stdin or passphrase_file)
    pw = checked_new(pw, name, interactive, "Passphrase: ")
    out = call("vault.create", {"name": name, "passphrase": pw, "remember": remember, "device_only": device_only})
    for n in out.pop("notices", []):
        notice(n)
    if STATE.json:
        emit_json({"vault_id": out["vault_id"], "name": out["name"]})
        return
    notice(f"Created vault {out['name']} (unlocked).")
    print(out["vault_id"])


@vault_app.command("list")
def list_(format_: PlainFormatOpt = None, color: ColorOpt = "auto") -> None:
    """List vaults (names are readable while locked)."""
    fmt = chosen(format_, color)
    out = call("vault.list")

    def text() -> None:
        if not out["vaults"]:
            notice(f"There are no vaults yet: create one with `{cli_command('vault', 'create', 'NAME')}`.")
            return
        table(["VAULT_ID", "NAME", "STATE"], [[v["vault_id"], v["name"], _state(v)] for v in out["vaults"]])

    emit(fmt, Listing(
        document={"vaults": out["vaults"]},
        items=out["vaults"],
        columns=("vault_id", "name", "locked"),
        text=text,
        md_item=_md_vault,
    ))


def _md_vault(v: dict[str, Any]) -> str:
    from .formats import md_escape

    return f"- **{md_escape(str(v['name']))}** `{v['vault_id']}`: {_state(v)}" + (f", {v['records']:,} records" if v.get("records") is not None else "")


def _state(v: dict[str, Any]) -> str:
    if v.get("corrupt"):
        return "corrupt (header unreadable)"
    return "locked" if v["locked"] else "unlocked"


@vault_app.command("status")
def status(
    vault: Annotated[str | None, typer.Argument(help="Vault id or name (default: all).")] = None,
    format_: PlainFormatOpt = None,
    color: ColorOpt = "auto",
) -> None:
    """Show whether vaults are locked, and a summary of each unlocked one.

    Its records, log size and policy, then the next step (unlock it, search it, see `rag status`).
    """
    fmt = chosen(format_, color)
    out = call("vault.status", {"vault": vault} if vault else {})
    rows = out["vaults"] if "vaults" in out else [out]

    def text() -> None:
        if not rows:
            notice(f"There are no vaults yet: create one with `{cli_command('vault', 'create', 'NAME')}`.")
        for i, v in enumerate(rows):
            if i:
                print()
            _print_vault(v)

    emit(fmt, Listing(
        document=out,
        items=rows,
        columns=("vault_id", "name", "locked", "records", "device_only", "log_bytes"),
        text=text,
        md_item=_md_vault,
    ))


def _print_vault(v: dict[str, Any]) -> None:
    """One vault's summary: its state, records, log size and policy, and what to do next."""
    from .render import mib, print_summary

    ref = str(v["name"])
    rows: list[tuple[str, str]] = [("State", _state(v))]
    hints: list[tuple[str, str]] = []
    if v.get("corrupt"):
        hints.append(("see SECURITY.md, Recovery", "its header cannot be read"))
    elif v["locked"]:
        hints.append((cli_command("vault", "unlock", ref), "unlock it to read, search or change it"))
    else:
        rows.append(("Records", f"{v.get('records', 0):,}"))
        if v.get("log_bytes") is not None:
            rows.append(("Log", mib(float(v["log_bytes"])) + " (sealed on disk)"))
        rows.append(("Device-only", "on: its text never leaves this machine" if v.get("device_only") else "off"))
        if v.get("records"):
            hints.append((cli_command("rag", "search", ref, "QUERY"), "search it"))
            hints.append((cli_command("rag", "status", ref), "documents, fragments, vectors and caps"))
        else:
            hints.append((cli_command("rag", "ingest", ref, "FOLDER", "-r"), "add Markdown and text files"))
    print_summary(f"Vault {v['name']} ({v['vault_id']})", rows, hints)


@vault_app.command("unlock")
def unlock(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    passphrase_stdin: PassStdin = False,
    passphrase_file: PassFile = None,
    remember: Annotated[bool, typer.Option("--remember", help="Keep the unlock secret in the OS keyring.")] = False,
) -> None:
    """Unlock a vault.

    Uses the OS keyring when the secret was remembered; else asks for the passphrase, up to three
    times on a terminal (once when it comes from stdin or a file).
    """
    params: dict[str, Any] = {"vault": vault, "remember": remember}
    if passphrase_stdin or passphrase_file:
        params["passphrase"] = _one_passphrase(passphrase_stdin, passphrase_file, confirm=False)
        out = call("vault.unlock", params)
    else:
        try:
            out = call("vault.unlock", params)
        except MemoriesError as exc:
            if exc.code not in ("passphrase_required", "keyring_unreadable"):
                raise
            if exc.code == "keyring_unreadable":
                notice(f"warning: {exc.message}")  # then ask, as when nothing is remembered
            out = unlock_asking(params)
    for n in out.pop("notices", []):
        notice(n)
    report(out, f"Unlocked vault {out['name']}.")


@vault_app.command("join")
def join(
    target: Annotated[
        str, typer.Argument(help="Where the vault syncs: a folder (/path, ~/path) or rclone:REMOTE:PATH.")
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="The vault's name on this device (default: its name on the target).")
    ] = None,
    passphrase_stdin: PassStdin = False,
    passphrase_file: PassFile = None,
    remember: Annotated[bool, typer.Option("--remember", help="Keep the unlock secret in the OS keyring.")] = False,
) -> None:
    """Make a vault on this device from a sync target and its passphrase, then sync it.

    Reads the vault from TARGET (added elsewhere with `memories sync add`), opens it with the
    vault's passphrase (asked up to three times on a terminal; once from stdin or a file), pulls
    every record and leaves the vault unlocked, syncing with TARGET from then on. Search by
    words works at once; embedding continues in the background (`memories status` shows it).
    Prints the new VAULT_ID alone on the last line.
    """
    params: dict[str, Any] = {"target": target, "remember": remember}
    if name is not None:
        params["name"] = name
    if passphrase_stdin or passphrase_file:
        params["passphrase"] = _one_passphrase(passphrase_stdin, passphrase_file, confirm=False)
        out = call("vault.join", params)
    else:
        out = unlock_asking(params, "vault.join")
    for n in out.pop("notices", []):
        notice(n)
    if STATE.json:
        emit_json(out)
        return
    for tid, result in (out.get("results") or {}).items():
        if result.get("error"):
            notice(f"warning: the first sync with {target} ({tid}) stopped: {result['error']}")
    records = int(out.get("records") or 0)
    notice(
        f"Joined vault {out['name']} ({out['vault_id']}, unlocked): {records:,} record{'s' if records != 1 else ''}; "
        "embedding continues in the background (`" + cli_command("status") + "` shows it)."
    )
    print(out["vault_id"])


@vault_app.command("lock")
def lock(
    vault: Annotated[str | None, typer.Argument(help="Vault id or name.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Lock every vault.")] = False,
) -> None:
    """Lock a vault.

    The daemon forgets its key and everything derived from it. Says which vaults it locked and
    which were locked already.
    """
    if not all_ and not vault:
        raise UsageError("name a vault to lock, or pass --all")
    out = call("vault.lock", {"all": True} if all_ else {"vault": vault})
    report(out, _lock_message(out, vault if not all_ else None))


def _lock_message(out: dict[str, Any], named: str | None) -> str:
    """What the lock did: a vault that was locked already is said so, not counted as locked."""
    locked, already = out["locked"], out.get("already_locked", [])
    if named is not None:
        return f"Locked vault {named}." if locked else f"Vault {named} was already locked."
    if not locked:
        return "Every vault was already locked." if already else "There are no vaults."
    return f"Locked {len(locked):,} vault{'s' if len(locked) != 1 else ''}" + (
        f"; {len(already):,} {'was' if len(already) == 1 else 'were'} already locked." if already else "."
    )


@vault_app.command("passwd")
def passwd(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    passphrase_stdin: Annotated[bool, typer.Option("--passphrase-stdin", help="Read the old and the new passphrase as two lines of stdin.")] = False,
    passphrase_file: Annotated[Path | None, typer.Option("--passphrase-file", help="Read the old and the new passphrase as two lines of this file.")] = None,
    rekey: Annotated[
        bool,
        typer.Option(
            "--rekey",
            help="Also make a new vault key and seal the whole vault again under it, so an old copy of header.json "
            "opens nothing written since (rewrites every file of the vault; needs room for a second copy).",
        ),
    ] = False,
) -> None:
    """Change a vault's passphrase; with --rekey, its key too.

    Plain passwd re-wraps the vault key under the new passphrase; no record is re-encrypted and the
    key stays the same. So a copy of the old header.json (in a backup, a synced or copied folder)
    still opens the vault with the old passphrase, including records written after the change.

    --rekey makes a new random vault key and seals everything again under it: the log, the head,
    the sealed vectors (none is embedded again) and the recall counters; the lexical index is
    rebuilt at the next search. After it, the old passphrase with an old header.json opens nothing:
    the vault refuses it as damaged. It rewrites the whole vault (time and disk space of a second
    copy), locks the vault meanwhile and unlocks it again if it was unlocked; grants keep working.
    Old copies of the vault files themselves (backups) still open with the old passphrase: they
    hold what they held.
    """
    if passphrase_stdin or passphrase_file:
        old, new = read_secret_lines(passphrase_stdin, passphrase_file, 2)
    else:
        old = prompt_secret("Current passphrase: ")
        new = prompt_secret("New passphrase: ", confirm=True)
    new = checked_new(new, vault, not (passphrase_stdin or passphrase_file), "New passphrase: ")
    params: dict[str, Any] = {"vault": vault, "old": old, "new": new}
    if rekey:
        params["rekey"] = True
    out = call("vault.passwd", params)
    if not rekey:
        report(out, "Passphrase changed (the vault key is the same: an old copy of header.json still opens it with the old passphrase; --rekey changes the key).")
        return
    message = "Passphrase and vault key changed: the vault was sealed again under a new key."
    if out.get("vector_entries_kept"):
        message += f" Sealed vectors kept: {out['vector_entries_kept']:,} (nothing embedded again)."
    report(out, message)


@vault_app.command("delete")
def delete(
    vault: Annotated[str, typer.Argument(help="Vault id or name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (needed off a terminal).")] = False,
) -> None:
    """Delete a vault's files (irreversible). Asks first on a terminal; elsewhere needs --yes."""
    if not yes:
        refused = f"deleting vault {vault} cannot be undone and there is no terminal to ask: pass --yes to delete it"
        if not confirm(f"Delete vault {vault} and all its records? This cannot be undone", refused=refused):
            notice("Nothing was deleted.")
            raise typer.Exit(1)
    out = call("vault.delete", {"vault": vault})
    report(out, f"Deleted vault {out.get('name') or out['deleted']}.")
    if not STATE.json:
        for n in out.get("notices", []):
            notice(f"warning: {n}")


@vault_app.command("compact")
def compact(vault: Annotated[str, typer.Argument(help="Vault id or name.")]) -> None:
    """Rewrite a vault's log without deleted records and old revisions.

    Revisions beyond [vault] keep_revisions go, with their sealed vectors and lexical-index rows.
    """
    out = call("vault.compact", {"vault": vault})
    message = f"Compacted: {out['revisions_before']:,} → {out['revisions_after']:,} revisions, {out['log_bytes']:,} bytes."
    if "vector_entries_kept" in out:
        message += f" Sealed vectors: {out['vector_entries_kept']:,} kept, {out['vector_entries_dropped']:,} dropped."
        if out.get("vector_files_skipped"):
            message += (
                f" {out['vector_files_skipped']:,} vector file(s) of a model not used since they were written were left"
                " as is (see SECURITY.md, Deleting)."
            )
    report(out, message)


@vault_app.command("policy")
def policy(
    vault: Annotated[str, typer.Argument(help="Vault id or name (must be unlocked).")],
    device_only: Annotated[str | None, typer.Option("--device-only", metavar="[on|off]", help="Keep the text on this machine (on) or allow remote services (off).")] = None,
    extract: Annotated[bool | None, typer.Option("--extract/--no-extract", help="Extract facts from conversations after capture (default on).")] = None,
) -> None:
    """Show or set a vault's policy.

    device-only: its text never leaves this machine; extract: facts are extracted from conversations
    after `memory capture`.
    """
    params: dict[str, Any] = {"vault": vault}
    if device_only is not None:
        if device_only not in ("on", "off"):
            raise UsageError("--device-only takes on or off")
        params["device_only"] = device_only == "on"
    if extract is not None:
        params["extract"] = extract
    out = call("vault.policy", params)
    if STATE.json:
        emit_json(out)
    else:
        print(f"device-only: {'on' if out['device_only'] else 'off'}")
        print(f"extract: {'on' if out.get('extract', True) else 'off'}")


# ------------------------------------------------------------------------- daemon


@daemon_app.command("start")
def daemon_start() -> None:
    """Start memoriesd in the background (waits until it answers)."""
    from .client import daemon_alive, start_daemon

    home = STATE.home
    if daemon_alive(home):
        out = call("daemon.status")
        notice(f"memoriesd is already running (pid {out['pid']}).")
    else:
        start_daemon(home)
        out = call("daemon.status")
        notice(f"memoriesd started (pid {out['pid']}).")
    if STATE.json:
        emit_json(out)


@daemon_app.command("stop")
def daemon_stop() -> None:
    """Stop memoriesd: every vault is locked and its key wiped."""
    home = STATE.home
    pid = _stop(home)
    if pid is None:
        notice("memoriesd is not running.")
        if STATE.json:
            emit_json({"stopped": False, "running": False})
        return
    notice("memoriesd stopped.")
    if STATE.json:
        emit_json({"stopped": True, "pid": pid})


def _stop(home: Any) -> int | None:
    """Stop the daemon of ``home`` and wait until it is gone; its pid, or None when it was not running.

    The replies' notices are not shown: "config.toml changed, run restart" is moot once it stops.
    """
    from .client import Client, daemon_alive

    if not daemon_alive(home):
        _clean_stale(home)
        return None
    pid = int(Client(home, autostart=False).call("daemon.status")["pid"])
    Client(home, autostart=False).call("daemon.stop")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (daemon_alive(home) or _pid_alive(pid)):
        time.sleep(0.05)
    return pid


def _refuse_invalid_config(home: Any) -> None:
    """Validate config.toml here, with the daemon's own parser (light: no numpy), before anything stops.

    A restart used to stop the daemon and then fail on the file, leaving every CLI and MCP call down.
    """
    from memoriesd.config import load_config
    from memoriesd.errors import ConfigError

    from .client import daemon_alive

    try:
        load_config(home.config_path)
    except ConfigError as exc:
        again = cli_command("daemon", "restart")
        state = ("memoriesd was not restarted and keeps running with the settings it started with"
                 if daemon_alive(home) else "memoriesd is not running and cannot start with it")
        why = exc.message if exc.message.endswith((".", "?")) else exc.message + "."
        raise ConfigError(f"config.toml is invalid: {why} {state}: fix the file, then run `{again}`") from None


@daemon_app.command("restart")
def daemon_restart() -> None:
    """Stop memoriesd and start it again, reading config.toml anew (apply an edit with this).

    Every vault is locked by the stop: the vaults are listed afterwards with the command that unlocks each.
    """
    from .client import start_daemon

    home = STATE.home
    _refuse_invalid_config(home)  # before the stop: a broken file must not take the running daemon down
    old_pid = _stop(home)
    try:
        start_daemon(home)  # as any command does when the daemon is not running
    except MemoriesError as exc:
        if exc.code != "config_invalid":
            raise
        raise MemoriesError(
            f"{exc.message} (memoriesd is stopped: run `{cli_command('daemon', 'restart')}` once the file is fixed)",
            code=exc.code,
        ) from None
    out = client(autostart=False).call("daemon.status")
    vaults = client(autostart=False).call("vault.list")["vaults"]
    names = [v["name"] for v in vaults]
    locked = [
        {
            "vault_id": v["vault_id"],
            "name": v["name"],
            # The name when it is unique (it reads better), else the id.
            "unlock": cli_command("vault", "unlock", v["name"] if names.count(v["name"]) == 1 else v["vault_id"]),
        }
        for v in vaults
        if v["locked"] and not v.get("corrupt")
    ]
    if STATE.json:
        emit_json({"restarted": old_pid is not None, "stopped_pid": old_pid, "pid": out["pid"], "config": out["config"], "locked": locked})
        return
    if old_pid is None:
        notice(f"memoriesd was not running: started it (pid {out['pid']}), with the settings of {out['config']}.")
    else:
        notice(f"memoriesd restarted (pid {old_pid} → {out['pid']}) with the settings of {out['config']}.")
    if not vaults:
        notice(f"There are no vaults yet: create one with `{cli_command('vault', 'create', 'NAME')}`.")
    elif locked:
        notice(f"{'Every vault is' if len(locked) == len(vaults) else 'These vaults are'} locked now; unlock the ones you use:")
        for v in locked:
            print(f"  {v['unlock']}")


@daemon_app.command("status")
def daemon_status() -> None:
    """Say whether memoriesd is running (and whether config.toml changed since it started)."""
    from .client import daemon_alive

    home = STATE.home
    if not daemon_alive(home):
        if STATE.json:
            emit_json({"running": False, "home": str(home.root)})
        else:
            print(f"memoriesd is not running for {home.root}")
        raise typer.Exit(6)
    out = client(autostart=False).call("daemon.status")
    out["running"] = True
    if STATE.json:
        emit_json(out)
    else:
        print(f"memoriesd {out['version']} running (pid {out['pid']}, up {out['uptime_seconds']:.0f} s, {len(out['unlocked'])} vault(s) unlocked) for {out['home']}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _clean_stale(home: Any) -> None:
    """A pid file whose process is gone, or a socket nobody answers on: leftovers of a crash."""
    pid_path = home.pid_path
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and not _pid_alive(pid):
        pid_path.unlink(missing_ok=True)
        if home.socket_path.exists():
            home.socket_path.unlink()


__all__ = ["vault_app", "daemon_app", "DaemonUnreachable", "signal", "fmt_time"]
