"""`--help` that teaches: capitalised usage, choices, whole summaries, examples and --json listed.

The real CLI in a subprocess, as a person runs it (help needs no daemon).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memories_cli.help import first_sentence

from .conftest import REPO, run_cli, short_tmpdir

PLAIN = {"COLUMNS": "80"}  # the width a pipe gets from click


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    d = short_tmpdir()
    yield d / "home"


def _help(home: Path, *command: str) -> str:
    r = run_cli(home, *command, "--help", env=PLAIN)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_rag_search_help_names_its_arguments_lists_the_modes_and_shows_examples(home: Path) -> None:
    text = _help(home, "rag", "search")
    assert text.startswith("Usage: memories rag search [OPTIONS] VAULT QUERY\n"), text
    assert "{vault}" not in text and "<str>" not in text
    assert "--mode [bm25|vector|hybrid]" in text
    assert "--match-mode [any|all|phrase]" in text
    assert "--fusion [convex|rrf]" in text
    assert "--kind [memory|card|fact|conversation]" in text
    assert "--since DATE" in text and "--limit N" in text
    examples = text.split("Examples:", 1)[1]
    assert len(re.findall(r"^\s+memories rag search \S+", examples, re.M)) >= 2, examples
    assert "--json" in text


@pytest.mark.parametrize("command", [("rag", "ingest"), ("rag", "ask"), ("grant", "create"), ("mcp",)])
def test_common_commands_show_examples_on_their_own_lines(home: Path, command: tuple[str, ...]) -> None:
    examples = _help(home, *command).split("Examples:", 1)[1]
    lines = [ln.strip() for ln in examples.splitlines() if ln.strip()]
    assert len(lines) >= 2 and lines[0].startswith("memories "), examples


def test_command_lists_show_whole_summaries(home: Path) -> None:
    for group in ((), ("rag",), ("memory",), ("vault",), ("grant",), ("daemon",)):
        listing = _help(home, *group).split("Commands:", 1)[1]
        assert "..." not in listing, (group, listing)
    rag = _help(home, "rag").split("Commands:", 1)[1]
    assert re.search(r"^\s+ingest\s+Ingest Markdown and text files as encrypted knowledge cards\.$", rag, re.M), rag


def test_json_is_listed_on_subcommands_but_not_on_mcp(home: Path) -> None:
    for command in (("memory", "list"), ("vault", "status"), ("rag", "ask"), ("grant", "list")):
        assert re.search(r"^\s+--json\s", _help(home, *command), re.M), command
    assert "--json" not in _help(home, "mcp")


def test_a_choice_outside_the_list_is_refused_in_one_line_naming_the_choices(home: Path) -> None:
    r = run_cli(home, "rag", "search", "v", "q", "--mode", "fuzzy")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error[usage]:"), r.stderr
    assert "bm25" in r.stderr and "hybrid" in r.stderr


def test_the_summary_is_the_whole_first_sentence() -> None:
    assert first_sentence("Search fragments, best first.\n\nMore here.") == "Search fragments, best first."
    assert first_sentence("Use e.g. a name. Then more.") == "Use e.g. a name."
    assert first_sentence("Labels [S1], [S2]... and so on") == "Labels [S1], [S2]... and so on"


def test_every_top_level_command_loads_and_its_listed_summary_is_its_own() -> None:
    """`memories --help` shows the table's summaries without importing the commands: they must stay true."""
    from memories_cli.help import first_sentence as summary_of
    from memories_cli.lazy import load_all
    from memories_cli.main import COMMANDS

    built = load_all(COMMANDS)
    for entry in COMMANDS:
        command = built[entry.name]
        assert command.name == entry.name
        assert entry.summary == summary_of(command.short_help or command.help or ""), entry.name
    assert len({e.name for e in COMMANDS}) == len(COMMANDS)


def test_help_lists_daily_commands_first_and_imports_no_command_module(home: Path) -> None:
    listing = _help(home).split("Commands:", 1)[1]
    names = re.findall(r"^  (\S+)", listing, re.M)
    assert names[:4] == ["status", "vault", "memory", "rag"], names
    assert names.index("rag") < names.index("doctor") < names.index("completion"), names
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules if m.endswith('_cmds')), file=sys.stderr))\n"
        "from memories_cli.main import run\nrun()\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "[]", r.stderr


def test_a_command_builds_only_its_own_group(home: Path) -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules if m.endswith('_cmds')), file=sys.stderr))\n"
        "from memories_cli.main import run\nrun()\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "vault", "--help"], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "['memories_cli.vault_cmds']", r.stderr
