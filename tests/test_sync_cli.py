"""`memories sync ...` and `memories vault join` through the real CLI: two real daemons on two homes
(two devices) and a folder target in a temp dir, with the cheap KDF config the conftest writes.

One flow (add, status, join, a note from each side on both after `sync now`, the other device in
`sync status`, remove) and the one-line errors a person meets first.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, Daemon, cli_json, print_log_if_failed, run_cli, short_tmpdir, write_config
from .terminal import Terminal

PASS = "correct horse battery staple"


@dataclass
class Pair:
    a: Daemon
    b: Daemon
    root: Path


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    root = short_tmpdir("ms")
    homes = [root / "a", root / "b"]
    for h in homes:
        write_config(h)
    keyring = {  # the second device remembers a joined vault's key (tests/memkeyring.py)
        "PYTHON_KEYRING_BACKEND": "tests.memkeyring.FileKeyring",
        "PYTHONPATH": str(REPO),
        "MEMORIES_TEST_KEYRING": str(root / "keyring.json"),
    }
    daemons = [Daemon(homes[0]).start(), Daemon(homes[1], env=keyring).start()]
    try:
        yield Pair(daemons[0], daemons[1], root)
    finally:
        for d in daemons:
            print_log_if_failed(request, d)
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def ok(home: Path, *args: str, input: str | None = None) -> tuple[str, str]:
    r = run_cli(home, *args, input=input)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout, r.stderr


def one_line_error(home: Path, *args: str, code: str, exit_code: int, input: str | None = None) -> str:
    """The command fails with exactly one ``error[code]:`` line on stderr and that exit code."""
    r = run_cli(home, *args, input=input)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == exit_code, r.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error[{code}]: "), r.stderr
    return lines[0]


def titles(home: Path, vault: str) -> set[str]:
    return {r["title"] for r in cli_json(home, "memory", "list", vault)["records"]}


def test_a_vault_added_on_one_device_and_joined_on_another_syncs_notes_both_ways(pair: Pair) -> None:
    a, b, target = pair.a.home, pair.b.home, pair.root / "target"
    vid = ok(a, "vault", "create", "notes", "--passphrase-stdin", input=PASS + "\n")[0].split()[-1]
    ok(a, "memory", "add", "notes", "--title", "from-a-first", "written on a before sync")

    _, said = ok(a, "sync", "add", "notes", str(target))
    assert f"syncs with {target}" in said and "vault join" in said
    status = cli_json(a, "sync", "status", "notes")
    (t,) = status["vaults"][0]["targets"]
    assert t["id"] == "t1" and t["target"] == str(target)
    ran = cli_json(a, "sync", "now", "notes")
    assert "error" not in ran["vaults"][0]["results"]["t1"]
    assert (target / "memories-sync.json").is_file()

    # The second device: the passphrase on stdin, the vault's id and records said.
    out, said = ok(b, "vault", "join", str(target), "--passphrase-stdin", input=PASS + "\n")
    assert out.split()[-1] == vid
    assert (
        "Joined vault notes" in said
        and "1 record;" in said
        and "embedding continues in the background" in said
    )
    assert titles(b, "notes") == {"from-a-first"}

    ok(a, "memory", "add", "notes", "--title", "from-a-later", "written on a after the join")
    ok(b, "memory", "add", "notes", "--title", "from-b", "written on b")
    for home in (a, b, a):  # a pushes, b pulls and pushes, a pulls: each waits for its cycle
        text, _ = ok(home, "sync", "now", "notes")
        assert f"notes → {target}: received" in text and "error" not in text
    assert titles(a, "notes") == titles(b, "notes") == {"from-a-first", "from-a-later", "from-b"}

    # Each device lists the other, by its id, with when it was last seen.
    a_status = cli_json(a, "sync", "status")["vaults"][0]
    b_status = cli_json(b, "sync", "status")["vaults"][0]
    assert [d["device"] for d in a_status["targets"][0]["devices"]] == [b_status["device"]]
    assert a_status["targets"][0]["devices"][0]["last_seen"]
    assert a_status["targets"][0]["pending"] == 0 and a_status["targets"][0]["error"] is None
    text, _ = ok(a, "sync", "status")
    assert f"({b_status['device']}): last seen" in text and "last push" in text and "conflicts: none" in text
    rows = ok(a, "sync", "status", "--format", "csv")[0].splitlines()
    assert rows[0].startswith("vault_id,name,target_id,target,last_push") and len(rows) == 2
    overview = ok(a, "status")[0]
    assert "SYNC" in overview and "synced " in overview
    assert cli_json(a, "status")["vaults"][0]["sync"]["targets"] == 1

    _, said = ok(a, "sync", "remove", "notes", "t1")
    assert f"no longer syncs with {target}" in said and "left as they are" in said
    assert (target / "memories-sync.json").is_file()  # nothing on the target is deleted
    assert cli_json(a, "sync", "status", "notes")["vaults"][0]["targets"] == []
    one_line_error(a, "sync", "now", "notes", code="usage", exit_code=2)


def test_sync_errors_are_one_line_with_what_to_do(pair: Pair) -> None:
    a, b, root = pair.a.home, pair.b.home, pair.root
    empty = root / "empty"
    empty.mkdir()
    line = one_line_error(
        b,
        "vault",
        "join",
        str(empty),
        "--passphrase-stdin",
        code="sync_target",
        exit_code=6,
        input=PASS + "\n",
    )
    assert "holds no vault" in line

    ok(a, "vault", "create", "work", "--passphrase-stdin", input=PASS + "\n")
    ok(a, "sync", "add", "work", str(root / "work-target"))
    ok(a, "sync", "now", "work")
    line = one_line_error(
        b,
        "vault",
        "join",
        str(root / "work-target"),
        "--passphrase-stdin",
        code="bad_passphrase",
        exit_code=3,
        input="not it\n",
    )
    assert PASS not in line and "not it" not in line
    assert cli_json(b, "vault", "list")["vaults"] == []  # a refused join leaves no vault behind
    t = Terminal(b, "vault", "join", str(root / "work-target"), "--name", "job", "--remember")  # asked again
    t.expect("Passphrase: ")
    t.type("wrong one")
    t.expect("wrong passphrase, try again (2 left)", "err")
    t.expect("Passphrase: ")
    t.type(PASS)
    assert t.finish() == 0, t.err
    assert "Joined vault job" in t.err and PASS not in t.err + t.out + t.screen
    assert [v["name"] for v in cli_json(b, "vault", "list")["vaults"]] == ["job"]
    ok(b, "vault", "lock", "job")
    ok(b, "vault", "unlock", "job")  # remembered at the join: no passphrase asked

    ok(a, "vault", "create", "private", "--device-only", "--passphrase-stdin", input=PASS + "\n")
    line = one_line_error(
        a, "sync", "add", "private", str(root / "private-target"), code="device_only", exit_code=1
    )
    assert "--device-only off" in line

    ok(a, "vault", "create", "other", "--passphrase-stdin", input=PASS + "\n")
    line = one_line_error(
        a, "sync", "add", "other", str(root / "work-target"), code="sync_target", exit_code=6
    )
    assert "holds another vault" in line
    line = one_line_error(a, "sync", "now", "other", code="usage", exit_code=2)
    assert "sync add other TARGET" in line

    r = run_cli(a, "--json", "sync", "now", "other")
    assert r.returncode == 2 and json.loads(r.stderr)["error"]["code"] == "usage"
