"""Shell completion: the scripts, and completing commands, options and vault names as a shell asks.

The real CLI in subprocesses driven by the variables the printed scripts set; a real daemon for the
vaults, then its home alone (daemon stopped) to complete from the vault headers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, Daemon, create_vault, run_cli

PASS = "correct horse"


def complete_bash(home: Path | None, line: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash's completion function gets for ``line`` (the word after the last space is completed)."""
    words = line.split(" ")
    r = subprocess.run(
        [sys.executable, "-m", "memories_cli.main"],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
        env=dict(os.environ, _MEMORIES_COMPLETE="complete_bash", COMP_WORDS=line, COMP_CWORD=str(len(words) - 1),
                 **({"MEMORIES_HOME": str(home)} if home else {}), **(env or {})),
    )
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if ln]


@pytest.mark.parametrize("shell,marker", [("bash", "complete -o default -F"), ("zsh", "#compdef memories"),
                                          ("fish", "complete --command memories")])
def test_completion_prints_a_script_for_each_shell(shell: str, marker: str, tmp_path: Path) -> None:
    r = run_cli(tmp_path, "completion", shell)
    assert r.returncode == 0, r.stderr
    assert marker in r.stdout and "_MEMORIES_COMPLETE=complete_" + shell in r.stdout


def test_commands_and_options_complete() -> None:
    assert complete_bash(None, "memories va") == ["vault"]
    assert "doctor" in complete_bash(None, "memories d")
    assert {"--mode", "--match-mode"} <= set(complete_bash(None, "memories rag search --m"))
    assert complete_bash(None, "memories mcp install c") == ["claude-code", "claude-desktop", "cursor", "codex"]


def test_vault_arguments_complete_names_from_the_daemon_then_from_the_headers_without_starting_it(daemon: Daemon) -> None:
    create_vault(daemon, "notes", PASS)
    create_vault(daemon, "novels", PASS)
    create_vault(daemon, "work", PASS)
    assert complete_bash(daemon.home, "memories rag search no") == ["notes", "novels"]
    assert complete_bash(daemon.home, "memories grant revoke --all w") == ["work"]
    daemon.stop()
    assert not daemon.socket_path.exists()
    assert complete_bash(daemon.home, "memories vault unlock ") == ["notes", "novels", "work"]
    # --home on the command line wins over $MEMORIES_HOME.
    assert complete_bash(None, f"memories --home {daemon.home} memory list w") == ["work"]
    assert not daemon.socket_path.exists()  # completing never starts the daemon
