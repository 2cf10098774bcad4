"""`memory list` pages and filters, and `memory search` prints one line per record.

A real daemon and the real CLI; `memory.list` over the socket without a limit keeps returning every
record (scripts rely on it).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

import pytest
from rich.cells import cell_len

from .conftest import Daemon, DaemonError, cli_json, create_vault, run_cli


@dataclass
class Listed:
    d: Daemon
    vid: str
    ids: list[str]  # oldest first


@pytest.fixture
def listed(daemon: Daemon) -> Listed:
    vid = create_vault(daemon)
    ids = []
    for i in range(7):
        tags = ["travel"] if i % 2 == 0 else ["Work"]
        ids.append(daemon.call("memory.add", {"vault": vid, "title": f"note {i}", "body": f"walrus number {i}", "tags": tags})["id"])
    # dated by its front matter, long ago: what `--since` reads, as `rag search --since` does
    ids.append(daemon.call("memory.add", {"vault": vid, "title": "old trip", "body": "---\ndate: 2001-02-03\n---\nwalrus in 2001", "tags": ["travel"]})["id"])
    ids.append(daemon.call("memory.add", {"vault": vid, "title": "pin", "body": "1234", "kind": "credential"})["id"])
    return Listed(daemon, vid, ids)


def test_memory_list_pages_newest_first_with_the_total(listed: Listed) -> None:
    newest_first = list(reversed(listed.ids))
    page = cli_json(listed.d.home, "memory", "list", listed.vid, "--limit", "3", "--offset", "2")
    assert [r["id"] for r in page["records"]] == newest_first[2:5]
    assert (page["total"], page["offset"], page["limit"]) == (9, 2, 3)
    assert len(cli_json(listed.d.home, "memory", "list", listed.vid)["records"]) == 9  # default limit 50
    beyond = cli_json(listed.d.home, "memory", "list", listed.vid, "--offset", "20")
    assert beyond["records"] == [] and beyond["total"] == 9

    r = run_cli(listed.d.home, "memory", "list", listed.vid, "--limit", "3", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "showing 1\u20133 of 9 records (next page: --offset 3)" in r.stderr
    assert "note 6" in r.stdout and "note 3" not in r.stdout


def test_memory_list_filters_by_kind_tag_and_since(listed: Listed) -> None:
    home, vid = listed.d.home, listed.vid
    travel = cli_json(home, "memory", "list", vid, "--tag", "TRAVEL")  # tags match case-insensitively
    assert travel["total"] == 5 and {r["title"] for r in travel["records"]} >= {"note 0", "old trip"}
    creds = cli_json(home, "memory", "list", vid, "--kind", "credential")
    assert [r["title"] for r in creds["records"]] == ["pin"]
    today = dt.date.today()
    recent = cli_json(home, "memory", "list", vid, "--since", (today - dt.timedelta(days=1)).isoformat(), "--tag", "travel")
    assert recent["total"] == 4 and "old trip" not in {r["title"] for r in recent["records"]}
    assert cli_json(home, "memory", "list", vid, "--since", (today + dt.timedelta(days=2)).isoformat())["total"] == 0


def test_bad_paging_and_filters_are_refused_in_one_line(listed: Listed) -> None:
    home, vid = listed.d.home, listed.vid
    for args, words in ((("--limit", "0"), "--limit"), (("--offset", "-1"), "--offset"),
                        (("--since", "31/12/2023"), "ISO date"), (("--kind", "poem"), "credential")):
        r = run_cli(home, "memory", "list", vid, *args)
        assert r.returncode == 2 or r.returncode == 1, (args, r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error[") and words in r.stderr, (args, r.stderr)
    with pytest.raises(DaemonError) as err:
        listed.d.call("memory.list", {"vault": vid, "limit": 0})
    assert err.value.code == "invalid_params"


def test_memory_list_over_the_socket_without_a_limit_returns_every_record(listed: Listed) -> None:
    out = listed.d.call("memory.list", {"vault": listed.vid})
    assert len(out["records"]) == 9 and out["total"] == 9 and out["limit"] is None
    assert [r["id"] for r in listed.d.call("memory.list", {"vault": listed.vid, "kind": "credential"})["records"]] == [listed.ids[-1]]


@pytest.mark.parametrize("columns", ["60", ""])  # "": not a terminal, so 100 columns
def test_memory_search_prints_a_block_per_record_cut_to_the_width(listed: Listed, columns: str) -> None:
    long = "walrus " + "very long text about a walrus on the ice " * 20
    listed.d.call("memory.add", {"vault": listed.vid, "title": "长城 walrus 的故事" * 3, "body": long})
    r = run_cli(listed.d.home, "memory", "search", listed.vid, "walrus", env={"COLUMNS": columns})
    assert r.returncode == 0, r.stderr
    found = json.loads(run_cli(listed.d.home, "--json", "memory", "search", listed.vid, "walrus").stdout)["results"]
    blocks = r.stdout.rstrip("\n").split("\n\n")
    assert len(blocks) == len(found) >= 8
    width = int(columns or 100)
    assert all(cell_len(line) <= width for line in r.stdout.splitlines()), r.stdout
    for i, (block, hit) in enumerate(zip(blocks, found, strict=True), start=1):
        head, where, *snippet = block.splitlines()
        assert head.startswith(f"{i}. ") and where.strip() == f"record {hit['id']}" and 1 <= len(snippet) <= 4
    if columns == "60":  # the wide title was cut, visibly
        assert any(block.splitlines()[0].endswith("\u2026") for block in blocks), r.stdout
