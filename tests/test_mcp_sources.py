"""MCP `memory_search` results name where each hit comes from: the source file and the line range of
the best passage, through a real MCP client session (the SDK's stdio client) against a real daemon."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from .conftest import REPO, Daemon, create_vault, run_cli, running_daemon
from .test_mcp import BOOT, call, ok, text_of

T = TypeVar("T")
PASS = "correct horse battery staple"
PAGE = """# chsh

Change the user's login shell.

More information: the manual page.

- Set a specific login shell for the current user:

`chsh -s /bin/zsh`

- List available shells:

`chsh -l`
"""


def _session(d: Daemon, token: str, fn: Callable[[ClientSession], Awaitable[T]], errlog: Path) -> T:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", BOOT, "--home", str(d.home), "mcp"],
        env={"MEMORIES_GRANT": token, "ORT_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )

    async def main() -> T:
        with open(errlog, "w") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await fn(session)

    return anyio.run(main)


def test_memory_search_results_carry_the_source_file_and_line_range(tmp_path: Path) -> None:
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "chsh.md").write_text(PAGE)
    with running_daemon() as d:
        vid = create_vault(d, "notes", PASS)
        assert run_cli(d.home, "rag", "ingest", "notes", str(folder), "-r").returncode == 0
        fact = d.call(
            "memory.add",
            {"vault": vid, "title": "Shell", "body": "first line\nThe user prefers zsh over bash."},
        )["id"]
        token = d.call("grant.create", {"vault": vid, "scopes": ["search"], "label": "t"})["token"]

        async def go(s: ClientSession) -> Any:
            return await call(s, "memory_search", query="zsh")

        result = _session(d, token, go, tmp_path / "mcp.err")
    data = ok(result)
    by_kind = {r["kind"]: r for r in data["results"]}
    card, note = by_kind["card"], by_kind["memory"]
    assert card["source"] == str((folder / "chsh.md").resolve())
    zsh_line = PAGE.splitlines().index("`chsh -s /bin/zsh`") + 1
    assert card["line"] <= zsh_line <= card["end_line"]
    assert f"source: {card['source']} lines {card['line']}-{card['end_line']}" in text_of(result) or (
        card["line"] == card["end_line"]
        and f"source: {card['source']} line {card['line']}" in text_of(result)
    )
    assert (
        note["id"] == fact
        and note["source"] is None
        and note["line"] >= 1
        and note["end_line"] >= note["line"]
    )
    assert "of the record" in text_of(result)
