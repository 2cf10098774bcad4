"""`memories doctor`: check a set-up and say, for each problem, the command that fixes it.

The checks are in :mod:`memories_cli.doctor_checks`, imported only when the command runs (start-up
time is a feature). The daemon is never started. Exit 1 when any check needs action, else 0.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .state import STATE, emit_json, safe_text


def doctor(
    deep: Annotated[bool, typer.Option("--deep", help="Also hash the model files (about 220 MB: a few seconds).")] = False,
) -> None:
    """Check the set-up and print each problem with the command that fixes it.

    Home permissions, config.toml, the daemon (reachable, same version, restart pending), the local
    model's files against the pinned manifest, the OS keyring, cache caps against unlocked vaults and
    proxy routes. An invalid config.toml is named alone: the checks that read it wait until it is
    fixed. Never starts the daemon. Exits 1 when something needs action, else 0.
    """
    from dataclasses import asdict

    from memoriesd import __version__

    from .doctor_checks import ACTION, OK, run_checks

    home = STATE.home
    findings = run_checks(home, deep=deep)
    needs_action = any(f.status == ACTION for f in findings)
    if STATE.json:
        emit_json({"home": str(home.root), "version": __version__, "needs_action": needs_action,
                   "checks": [asdict(f) for f in findings]})
    else:
        import shutil
        import textwrap

        width = max(60, shutil.get_terminal_size((100, 24)).columns - 1)
        pad = " " * 19
        print(f"memories doctor {__version__}: {home.root}")
        for f in findings:
            head = f"  {f.status:<6}  {f.check:<7}  "
            print(textwrap.fill(safe_text(f.message), width, initial_indent=head, subsequent_indent=pad,
                                break_on_hyphens=False, break_long_words=False))
            if f.fix and f.status != OK:
                print(textwrap.fill(safe_text(f.fix), width, initial_indent=pad + "fix: ", subsequent_indent=pad + "     ",
                                    break_on_hyphens=False, break_long_words=False))
        n = sum(f.status == ACTION for f in findings)
        print(f"{n} problem(s) need action." if n else "Nothing needs action.")
    if needs_action:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(
        "doctor",
        epilog="""Examples:

\b
  memories doctor
  memories doctor --deep          # also verify the model files' SHA-256
  memories doctor --json | jq '.checks[] | select(.status == "action")'""",
    )(doctor)
