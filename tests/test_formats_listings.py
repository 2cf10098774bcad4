"""`--format jsonl|csv|md` on `grant list`, `memory forget`, `memory summarize` and `memory prune`.

One real daemon and vault for the module, driven by the real CLI in subprocesses: every format lists
the same items as the command's JSON document, and `--json` with another format is a usage error.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import Daemon, cli_json, cli_ok, create_vault, run_cli, running_daemon

GRANT_COLUMNS = ["grant_id", "vault_id", "label", "scopes", "cards_only", "created", "expires", "expired", "last_used"]
FORGET_COLUMNS = ["id", "kind", "category", "title", "text", "revisions", "deleted", "match", "score"]
SUMMARIZE_COLUMNS = ["id", "kind", "title", "text", "day", "tokens", "batch"]
PRUNE_COLUMNS = ["id", "revision", "category", "key", "text", "importance", "recalls", "last_recall", "updated"]


@dataclass
class Env:
    d: Daemon
    vid: str
    notes: list[str]  # memory records

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return cli_ok(self.d.home, *args, env=env)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_daemon() as d:
        vid = create_vault(d)
        notes = [
            str(d.call("memory.add", {"vault": vid, "title": title, "body": body})["id"])
            for title, body in (("Parrot", "The parrot, Kiwi, talks every morning."), ("Garden", "Tomatoes by the south wall."), ("", "A note, without a title."))
        ]
        for text in ("The user prefers green tea.", "The user walks to work.", "The user's sister lives in Oslo."):
            d.call("memory.remember", {"vault": vid, "text": text})
        d.call("grant.create", {"vault": vid, "label": "claude, desktop"})
        d.call("grant.create", {"vault": vid, "scopes": ["search", "context"], "cards_only": True})
        yield Env(d, vid, notes)


def _check_formats(env: Env, args: Sequence[str], key: str, columns: list[str]) -> list[dict[str, Any]]:
    """jsonl, csv and md list exactly the items of the JSON document's ``key`` list; the items."""
    items: list[dict[str, Any]] = cli_json(env.d.home, *args)[key]
    assert items
    lines = env.cli(*args, "--format", "jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines] == items
    table = list(csv.reader(io.StringIO(env.cli(*args, "--format", "csv").stdout)))
    assert table[0] == columns and len(table) == 1 + len(items)
    assert [row[0] for row in table[1:]] == [str(i[columns[0]]) for i in items]
    md = env.cli(*args, "--format", "md").stdout.splitlines()
    assert len([line for line in md if line.startswith("- ")]) == len(items) and all(line.startswith("- ") for line in md)
    bad = run_cli(env.d.home, "--json", *args, "--format", "csv")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--format" in bad.stderr and bad.stdout == ""
    return items


def test_grant_list_formats_list_the_grants_and_never_a_token(env: Env) -> None:
    grants = _check_formats(env, ("grant", "list"), "grants", GRANT_COLUMNS)
    assert len(grants) == 2 and all("token" not in g for g in grants)
    rows = list(csv.DictReader(io.StringIO(env.cli("grant", "list", "--format", "csv").stdout)))
    labelled = next(r for r in rows if r["label"] == "claude, desktop")  # a comma inside a cell stays one cell
    assert labelled["scopes"] == "search;read;retrieve" and labelled["cards_only"] == "false"
    assert "mg_" not in env.cli("grant", "list", "--format", "md").stdout
    text = env.cli("grant", "list", env={"COLUMNS": "250"}).stdout.splitlines()  # text stays the table
    assert text[0].split() == ["GRANT_ID", "VAULT_ID", "LABEL", "SCOPES", "EXPIRES", "LAST", "USE"] and len(text) == 3


def test_forget_dry_run_formats_list_what_would_go_and_forget_nothing(env: Env) -> None:
    args = ("memory", "forget", env.vid, "--all", "--kind", "memory", "--dry-run")
    would = _check_formats(env, args, "records", FORGET_COLUMNS)
    assert sorted(r["id"] for r in would) == sorted(env.notes)
    md = env.cli(*args, "--format", "md").stdout
    assert "**A note, without a title.**" in md and "**Parrot**" in md  # untitled: its text
    # A machine format does not stand for --yes: off a terminal, forgetting for real still needs it.
    refused = run_cli(env.d.home, "memory", "forget", env.vid, "--id", env.notes[0], "--format", "jsonl")
    assert refused.returncode == 2 and "--yes" in refused.stderr and refused.stdout == ""
    assert len(env.d.call("memory.list", {"vault": env.vid, "kind": "memory"})["records"]) == len(env.notes)


def test_forget_for_real_lists_the_forgotten_records_as_jsonl(env: Env) -> None:
    rid = str(env.d.call("memory.add", {"vault": env.vid, "title": "Locker", "body": "The locker code changes weekly."})["id"])
    r = env.cli("memory", "forget", env.vid, "--id", rid, "--yes", "--format", "jsonl")
    (line,) = r.stdout.splitlines()
    assert json.loads(line)["id"] == rid and json.loads(line)["title"] == "Locker"
    assert "Forgot 1 record(s)" in r.stderr
    left = {x["id"] for x in env.d.call("memory.list", {"vault": env.vid, "kind": "memory"})["records"]}
    assert left == set(env.notes)
    nothing = env.cli("memory", "forget", env.vid, "--query", "submarine", "--scope", "topic", "--yes", "--format", "csv")
    assert nothing.stdout.splitlines() == [",".join(FORGET_COLUMNS)] and "nothing to forget" in nothing.stderr


def test_summarize_dry_run_formats_list_the_candidates(env: Env) -> None:
    cands = _check_formats(env, ("memory", "summarize", env.vid, "--kind", "fact", "--older-than", "0"), "candidates", SUMMARIZE_COLUMNS)
    assert len(cands) == 3 and all(c["kind"] == "fact" for c in cands)


def test_prune_dry_run_formats_list_the_stale_facts(env: Env) -> None:
    facts = _check_formats(env, ("memory", "prune", env.vid, "--below-importance", "1"), "records", PRUNE_COLUMNS)
    assert len(facts) == 3
    assert len(env.d.call("memory.list", {"vault": env.vid, "kind": "fact"})["records"]) == 3
