"""`memories mcp install|uninstall CLIENT`: real client configuration files in a temporary HOME.

One real daemon for the module; the real CLI in subprocesses with HOME pointing at a fresh folder
holding each client's file in its documented format and place, with other servers and keys in it.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from memories_cli.mcp_clients import CLIENTS, config_path

from .conftest import Daemon, create_vault, run_cli, running_daemon, short_tmpdir

PASS = "correct horse"

CLAUDE_CODE = {
    "numStartups": 42,
    "oauthAccount": {"emailAddress": "a@example.com"},
    "projects": {"/src/app": {"mcpServers": {"local-one": {"type": "stdio", "command": "node", "args": ["x.js"]}}}},
    "mcpServers": {"github": {"type": "stdio", "command": "npx", "args": ["-y", "@mcp/github"], "env": {"GITHUB_TOKEN": "ghp_x"}}},
}
CLAUDE_DESKTOP = {
    "mcpServers": {"filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me"]}},
    "preferences": {"menuBarEnabled": False},
}
CURSOR = {
    "mcpServers": {
        "context7": {"url": "https://mcp.context7.com/mcp", "headers": {"CONTEXT7_API_KEY": "${env:CONTEXT7_API_KEY}"}},
        "playwright": {"command": "npx", "args": ["-y", "@playwright/mcp@latest"]},
    }
}
CODEX = """# Codex settings
model = "o3"  # the default model

[mcp_servers.docs]
command = "npx"
args = ["-y", "mcp-server"]

[mcp_servers.docs.env]
API_KEY = "value"

[profiles.fast]
model = "gpt-4.1"
"""
ORIGINAL: dict[str, Any] = {"claude-code": CLAUDE_CODE, "claude-desktop": CLAUDE_DESKTOP, "cursor": CURSOR, "codex": CODEX}


@pytest.fixture(scope="module")
def d() -> Iterator[Daemon]:
    with running_daemon() as daemon:
        vid = create_vault(daemon, "notes", PASS)
        daemon.call("memory.add", {"vault": vid, "title": "Lighthouse", "body": "The keeper feeds the zebra."})
        create_vault(daemon, "work", PASS)
        yield daemon


@pytest.fixture
def user_home() -> Iterator[Path]:
    root = short_tmpdir("uh")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def env_for(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "XDG_CONFIG_HOME": "", "CODEX_HOME": ""}


def seed(client: str, home: Path) -> Path:
    path = config_path(CLIENTS[client], env_for(home), platform="linux")
    path.parent.mkdir(parents=True, exist_ok=True)
    original = ORIGINAL[client]
    path.write_text(original if isinstance(original, str) else json.dumps(original, indent=2) + "\n")
    path.chmod(0o600)
    return path


def parse(client: str, path: Path) -> dict[str, Any]:
    text = path.read_text()
    return tomllib.loads(text) if client == "codex" else dict(json.loads(text))


def servers(client: str, data: dict[str, Any]) -> dict[str, Any]:
    return dict(data["mcp_servers" if client == "codex" else "mcpServers"])


def grants(d: Daemon) -> dict[str, dict[str, Any]]:
    return {g["grant_id"]: g for g in d.call("grant.list")["grants"]}


@pytest.mark.parametrize("client", ["claude-code", "claude-desktop", "cursor", "codex"])
def test_install_adds_one_entry_keeps_everything_else_and_uninstall_restores_the_rest(
    d: Daemon, user_home: Path, client: str
) -> None:
    path = seed(client, user_home)
    before = path.read_bytes()
    r = run_cli(d.home, "mcp", "install", client, "notes", env=env_for(user_home))
    assert r.returncode == 0, r.stderr
    assert "Restart" in r.stderr and str(path) in r.stderr
    data = parse(client, path)
    want = tomllib.loads(CODEX) if client == "codex" else ORIGINAL[client]
    # Every other key and server is exactly as it was.
    for key, value in want.items():
        if key not in ("mcpServers", "mcp_servers"):
            assert data[key] == value, key
    for name, entry in servers(client, want).items():
        assert servers(client, data)[name] == entry, name
    entry = servers(client, data)["memories"]
    assert os.path.isabs(entry["command"]) and os.access(entry["command"], os.X_OK) and entry["args"][-1] == "mcp"
    assert entry["env"]["MEMORIES_HOME"] == str(d.home) and entry["env"]["MEMORIES_GRANT"].startswith("mg_")
    assert (entry.get("type") == "stdio") == (client == "claude-code")
    gid = entry["env"]["MEMORIES_GRANT"].split("_")[2]
    assert grants(d)[gid]["label"] == client
    assert path.stat().st_mode & 0o777 == 0o600
    backups = sorted(path.parent.glob(path.name + ".bak.*"))
    assert len(backups) == 1 and backups[0].read_bytes() == before and backups[0].stat().st_mode & 0o777 == 0o600
    # Uninstall: the rest of the file as it was, the grant revoked.
    r = run_cli(d.home, "mcp", "uninstall", client, env=env_for(user_home))
    assert r.returncode == 0, r.stderr
    assert parse(client, path) == (tomllib.loads(CODEX) if client == "codex" else ORIGINAL[client])
    if client == "codex":
        assert path.read_text() == CODEX  # tomlkit keeps the comments and the layout
    assert gid not in grants(d)
    assert len(list(path.parent.glob(path.name + ".bak.*"))) == 2


@pytest.mark.parametrize("client,broken", [("cursor", '{"mcpServers": {"a": 1},'), ("codex", "[mcp_servers.docs\ncommand=1\n"),
                                           ("claude-desktop", '{"mcpServers": ["not", "a", "table"]}')])
def test_a_malformed_config_is_refused_in_one_line_untouched_and_no_grant_is_made(
    d: Daemon, user_home: Path, client: str, broken: str
) -> None:
    path = config_path(CLIENTS[client], env_for(user_home), platform="linux")
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    before = set(grants(d))
    r = run_cli(d.home, "mcp", "install", client, "notes", env=env_for(user_home))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error[client_config_invalid]:") and str(path) in r.stderr and "not changed" in r.stderr
    assert path.read_text() == broken and not list(path.parent.glob("*.bak.*"))
    assert set(grants(d)) == before


def test_another_server_of_the_same_name_is_never_replaced(d: Daemon, user_home: Path) -> None:
    path = config_path(CLIENTS["cursor"], env_for(user_home))
    path.parent.mkdir(parents=True)
    theirs = {"mcpServers": {"memories": {"command": "/opt/other/memories-server", "args": []}}}
    path.write_text(json.dumps(theirs))
    before = set(grants(d))
    r = run_cli(d.home, "mcp", "install", "cursor", "notes", env=env_for(user_home))
    assert r.returncode == 2 and "not Memories" in r.stderr and "--name" in r.stderr, r.stderr
    assert json.loads(path.read_text()) == theirs and set(grants(d)) == before
    r = run_cli(d.home, "mcp", "uninstall", "cursor", env=env_for(user_home))
    assert r.returncode == 2 and "not a Memories entry" in r.stderr
    assert json.loads(path.read_text()) == theirs


def test_installing_again_replaces_the_entry_and_revokes_the_old_grant_and_another_vault_needs_a_name(
    d: Daemon, user_home: Path
) -> None:
    env = env_for(user_home)
    path = config_path(CLIENTS["claude-code"], env)
    assert run_cli(d.home, "mcp", "install", "claude-code", "notes", env=env).returncode == 0
    assert path.stat().st_mode & 0o777 == 0o600  # a new file holding a token
    first = json.loads(path.read_text())["mcpServers"]["memories"]["env"]["MEMORIES_GRANT"].split("_")[2]
    r = run_cli(d.home, "mcp", "install", "claude-code", "notes", "--ttl", "7d", env=env)
    assert r.returncode == 0 and "Replaced" in r.stderr, r.stderr
    second = json.loads(path.read_text())["mcpServers"]["memories"]["env"]["MEMORIES_GRANT"].split("_")[2]
    assert first not in grants(d) and second in grants(d)
    before = set(grants(d))
    r = run_cli(d.home, "mcp", "install", "claude-code", "work", env=env)
    assert r.returncode == 2 and "--name" in r.stderr and set(grants(d)) == before, r.stderr
    assert run_cli(d.home, "mcp", "install", "claude-code", "work", "--name", "memories-work", env=env).returncode == 0
    assert set(json.loads(path.read_text())["mcpServers"]) == {"memories", "memories-work"}
    r = run_cli(d.home, "--json", "mcp", "uninstall", "claude-code", "work", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["removed"] == ["memories-work"]
    assert set(json.loads(path.read_text())["mcpServers"]) == {"memories"}
    assert run_cli(d.home, "mcp", "uninstall", "claude-code", env=env).returncode == 0
    assert second not in grants(d)


def test_print_writes_nothing_and_shows_the_entry_in_the_clients_format(d: Daemon, user_home: Path) -> None:
    env = env_for(user_home)
    r = run_cli(d.home, "mcp", "install", "codex", "notes", "--print", env=env)
    assert r.returncode == 0, r.stderr
    table = tomllib.loads(r.stdout)["mcp_servers"]["memories"]
    assert table["args"][-1] == "mcp" and table["env"]["MEMORIES_GRANT"].startswith("mg_")
    r = run_cli(d.home, "mcp", "install", "claude-desktop", "notes", "--print", env=env)
    entry = json.loads(r.stdout)["mcpServers"]["memories"]
    assert set(entry) == {"command", "args", "env"}
    assert not any(user_home.iterdir())


def test_the_installed_entry_starts_a_server_the_client_can_search_with(d: Daemon, user_home: Path) -> None:
    env = env_for(user_home)
    assert run_cli(d.home, "mcp", "install", "cursor", "notes", env=env).returncode == 0
    entry = json.loads(config_path(CLIENTS["cursor"], env).read_text())["mcpServers"]["memories"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"],
                                   env={**entry["env"], "ORT_DISABLE_TELEMETRY": "1"}, cwd="/")

    async def main() -> str:
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):  # noqa: SIM115
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("memory_search", {"query": "zebra"})
                return "".join(getattr(c, "text", "") for c in result.content)

    assert "Lighthouse" in anyio.run(main)


def test_each_client_file_is_where_its_documentation_puts_it() -> None:
    env = {"HOME": "/home/me"}
    assert config_path(CLIENTS["claude-code"], env) == Path("/home/me/.claude.json")
    assert config_path(CLIENTS["cursor"], env) == Path("/home/me/.cursor/mcp.json")
    assert config_path(CLIENTS["codex"], env) == Path("/home/me/.codex/config.toml")
    assert config_path(CLIENTS["codex"], {**env, "CODEX_HOME": "/srv/codex"}) == Path("/srv/codex/config.toml")
    desktop = CLIENTS["claude-desktop"]
    assert config_path(desktop, env, platform="linux") == Path("/home/me/.config/Claude/claude_desktop_config.json")
    assert config_path(desktop, {**env, "XDG_CONFIG_HOME": "/x"}, platform="linux") == Path("/x/Claude/claude_desktop_config.json")
    assert config_path(desktop, env, platform="darwin") == Path(
        "/home/me/Library/Application Support/Claude/claude_desktop_config.json"
    )
