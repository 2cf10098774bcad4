"""The first hour of a newcomer (issue 20): an edited config.toml, `daemon restart`, the MCP set-up
printed by `grant create`, confirmations off a terminal, "already locked", and `rag index`'s last line.

Real daemons, the real CLI in subprocesses, the MCP SDK's stdio client against the printed set-up.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from memories_cli.grant_setup import mcp_env
from memories_cli.state import STATE
from memoriesd.server.config_watch import ConfigWatch, name_config_path

from .conftest import REPO, Daemon, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .tinymodel import TOPIC_NOTES, make_tiny_model

PASS = "correct horse"


@pytest.fixture
def cli_home(home: Path) -> Iterator[Path]:
    """A home whose daemon the CLI itself starts (and restarts); stopped after the test."""
    yield home
    run_cli(home, "daemon", "stop", timeout=60)


def _restart_notice(home: Path) -> str:
    return f"config.toml ({home / 'config.toml'}) changed since the daemon started: run `memories daemon restart`"


def test_an_edited_config_is_announced_in_every_reply_until_daemon_restart_which_lists_unlock_commands(cli_home: Path) -> None:
    home = cli_home
    r = run_cli(home, "vault", "create", "personal", "--passphrase-stdin", input=PASS + "\n")
    assert r.returncode == 0, r.stderr
    assert "changed since the daemon started" not in r.stderr
    config = home / "config.toml"
    config.write_text(config.read_text() + "\n[search]\ncandidates = 50\n")
    # Every reply says so, once per command: a plain list, a JSON status, even an error.
    r = run_cli(home, "vault", "list")
    assert r.returncode == 0 and r.stderr.count(_restart_notice(home)) == 1, r.stderr
    assert cli_json(home, "daemon", "status")["restart_pending"] is True
    r = run_cli(home, "memory", "read", "personal", "nosuchrecord")
    assert r.returncode == 4 and _restart_notice(home) in r.stderr
    r = run_cli(home, "daemon", "restart")
    assert r.returncode == 0, r.stderr
    assert "restarted" in r.stderr and "locked now" in r.stderr and "changed since" not in r.stderr
    assert r.stdout.strip() == f"memories --home {home} vault unlock personal"
    # The new daemon read the edited file: no notice, and the vault is locked as the restart said.
    r = run_cli(home, "--json", "vault", "list")
    assert r.returncode == 0 and "changed since" not in r.stderr
    assert [v["locked"] for v in json.loads(r.stdout)["vaults"]] == [True]
    assert cli_json(home, "daemon", "status")["restart_pending"] is False
    r = run_cli(home, "vault", "unlock", "personal", "--passphrase-stdin", input=PASS + "\n")
    assert r.returncode == 0, r.stderr


def test_a_broken_config_names_its_full_path_and_restart_refuses_it_leaving_the_daemon_running(cli_home: Path) -> None:
    home = cli_home
    assert run_cli(home, "daemon", "start").returncode == 0
    config = home / "config.toml"
    good = config.read_text()
    config.write_text(good + "\n[daemon]\nbogus_key = 1\n")
    r = run_cli(home, "daemon", "restart")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "error[config_invalid]: config.toml is invalid: unknown config key daemon.bogus_key" in r.stderr
    assert f"(config file {config})" in r.stderr and f"memories --home {home} daemon restart" in r.stderr
    assert run_cli(home, "daemon", "status").returncode == 0  # still running, as the message said (test_config_edits)
    config.write_text(good)
    r = run_cli(home, "--json", "daemon", "restart")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["restarted"] is True and out["config"] == str(config) and out["locked"] == []
    assert "no vaults yet" not in r.stderr  # --json: the notices are for people


def test_touching_the_config_or_editing_watch_tables_is_no_pending_restart(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[vault]\nkeep_revisions = 5\n")
    watch = ConfigWatch(path)
    assert not watch.changed() and watch.notices() == []
    path.write_text("[vault]\nkeep_revisions = 5\n")  # same bytes saved again (new mtime)
    assert not watch.changed()
    # `rag watch` / `rag unwatch` apply these live: no restart is needed for them.
    path.write_text('[vault]\nkeep_revisions = 5\n[watch]\ndebounce_seconds = 2\n[[watch.folder]]\nvault = "v"\npath = "/x"\n')
    assert not watch.changed()
    path.write_text("[vault]\nkeep_revisions = 6\n")
    assert watch.changed() and watch.notices() == [
        f"config.toml ({path}) changed since the daemon started: run `memories daemon restart` to apply it; "
        "unlocked vaults will lock"
    ]
    path.write_text("[vault]\nkeep_revisions = 5  # back as it was\n")
    assert not watch.changed()
    path.unlink()
    assert watch.changed()


def test_errors_that_point_at_config_toml_name_its_full_path_and_the_restart_command() -> None:
    path = Path("/home/me/mem/config.toml")
    msg = name_config_path(
        "no generation service is configured: add a [generation] table to config.toml and restart the daemon", path
    )
    assert msg == (
        "no generation service is configured: add a [generation] table to /home/me/mem/config.toml "
        "and run `memories daemon restart`"
    )
    assert name_config_path("[rerank] protocol must be \"compatible\"", path, "config_invalid").endswith(
        "(config file /home/me/mem/config.toml; then run `memories daemon restart`)"
    )
    assert name_config_path("over the cache cap of 10: raise [index] max_fragments in config.toml", path, "cap_exceeded") == (
        "over the cache cap of 10: raise [index] max_fragments in /home/me/mem/config.toml and run `memories daemon restart`"
    )
    assert name_config_path("vault notes is locked", path, "vault_locked") == "vault notes is locked"


def test_grant_create_prints_an_absolute_command_and_the_custom_home_and_the_client_connects(daemon: Daemon) -> None:
    vid = create_vault(daemon, "notes", PASS)
    daemon.call("memory.add", {"vault": vid, "title": "Lighthouse", "body": "The keeper feeds the zebra."})
    r = run_cli(daemon.home, "grant", "create", "notes")
    assert r.returncode == 0, r.stderr
    claude = next(ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("claude mcp add"))
    entry = json.loads(r.stdout[r.stdout.index("{") :])["mcpServers"]["memories"]
    command = entry["command"]
    assert os.path.isabs(command) and os.access(command, os.X_OK) and entry["args"][-1] == "mcp"
    assert entry["env"]["MEMORIES_HOME"] == str(daemon.home)
    assert f"-e MEMORIES_HOME={daemon.home} " in claude and claude.endswith(f"-- {command} mcp")
    # The client starts exactly what was printed, with its own bare environment and working directory.
    params = StdioServerParameters(command=command, args=entry["args"], env={**entry["env"], "ORT_DISABLE_TELEMETRY": "1"}, cwd="/")

    async def main() -> str:
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):  # noqa: SIM115
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("memory_search", {"query": "zebra"})
                assert not result.is_error, result
                return "".join(getattr(c, "text", "") for c in result.content)

    assert "Lighthouse" in anyio.run(main)


def test_the_mcp_environment_names_the_home_only_when_it_is_not_the_default() -> None:
    saved = STATE.home_arg
    try:
        STATE.home_arg = str(Path.home() / ".memories")
        assert mcp_env("mg_x") == {"MEMORIES_GRANT": "mg_x"}
        STATE.home_arg = "/srv/mem"
        assert mcp_env("mg_x") == {"MEMORIES_GRANT": "mg_x", "MEMORIES_HOME": "/srv/mem"}
    finally:
        STATE.home_arg = saved


def test_mcp_help_explains_grants_scopes_and_both_client_set_ups() -> None:
    r = subprocess.run([sys.executable, "-m", "memories_cli.main", "mcp", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for part in ("memories grant create", "Scopes:", "forget-all", "claude mcp add memories", '"mcpServers"', "MEMORIES_HOME"):
        assert part in text, part


def _on_a_terminal(home: Path, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a pseudo-terminal on stdin, answering a question with ``answer``."""
    master, slave = pty.openpty()
    try:
        os.write(master, answer.encode())
        return subprocess.run(
            [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
            stdin=slave, capture_output=True, text=True, cwd=REPO, timeout=60,
        )
    finally:
        os.close(slave)
        os.close(master)


def test_destructive_commands_without_a_terminal_or_yes_fail_at_once_with_confirmation_required(daemon: Daemon) -> None:
    vid = create_vault(daemon, "notes", PASS)
    rid = daemon.call("memory.add", {"vault": vid, "title": "t", "body": "keep me"})["id"]
    r = subprocess.run(
        [sys.executable, "-m", "memories_cli.main", "--home", str(daemon.home), "vault", "delete", "notes"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert r.returncode == 2 and r.stderr.startswith("error[confirmation_required]: ") and "--yes" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "interrupted" not in r.stderr
    r = run_cli(daemon.home, "--json", "memory", "forget", "notes", "--id", rid)
    assert r.returncode == 2 and json.loads(r.stderr)["error"]["code"] == "confirmation_required"
    assert daemon.call("memory.read", {"vault": vid, "id": rid})["body"] == "keep me"
    # On a terminal the question is asked; "n" keeps everything.
    r = _on_a_terminal(daemon.home, "n\n", "vault", "delete", "notes")
    assert r.returncode == 1 and "Nothing was deleted" in r.stderr, r.stderr
    assert [v["name"] for v in daemon.call("vault.list")["vaults"]] == ["notes"]
    assert run_cli(daemon.home, "vault", "delete", "notes", "--yes").returncode == 0


def test_vault_lock_says_what_it_did_and_already_locked_when_nothing(daemon: Daemon) -> None:
    a = create_vault(daemon, "alpha", PASS)
    create_vault(daemon, "beta", PASS)
    r = run_cli(daemon.home, "vault", "lock", "alpha")
    assert r.returncode == 0 and r.stderr.strip() == "Locked vault alpha."
    r = run_cli(daemon.home, "vault", "lock", "alpha")
    assert r.returncode == 0 and r.stderr.strip() == "Vault alpha was already locked."
    assert cli_json(daemon.home, "vault", "lock", "alpha") == {"locked": [], "already_locked": [a]}
    r = run_cli(daemon.home, "vault", "lock", "--all")
    assert r.stderr.strip() == "Locked 1 vault; 1 was already locked."
    r = run_cli(daemon.home, "vault", "lock", "--all")
    assert r.stderr.strip() == "Every vault was already locked."


@pytest.fixture
def model_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    model = tmp_path_factory.mktemp("model") / "tiny"
    make_tiny_model(model, seed=1)
    root = short_tmpdir()
    home = root / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n')
    yield home
    shutil.rmtree(root, ignore_errors=True)


def test_rag_index_ends_with_a_plain_summary_line(model_home: Path) -> None:
    d = Daemon(model_home, env={"HOME": str(model_home.parent)}).start()
    try:
        vid = create_vault(d, "notes", PASS)
        for title, body in TOPIC_NOTES:
            d.call("memory.add", {"vault": vid, "title": title, "body": body})
        r = run_cli(model_home, "rag", "index", "notes")
        assert r.returncode == 0, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        n = len(TOPIC_NOTES)
        assert re.fullmatch(
            rf"Embedded {n} fragments in [0-9.]+ s \([0-9,.]+ fragments/s\); skipped 0\. {n} of {n} fragments have vectors\.", last
        ), last
        assert not re.search(r"[0-9a-f]{64}", r.stderr + r.stdout)  # the model's identity hash: --json only
        out = cli_json(model_home, "rag", "index", "notes")
        assert re.fullmatch(r"[0-9a-f]{64}", out["model"]) and out["embedded"] == 0 and out["skipped"] == 0
    finally:
        d.stop()
