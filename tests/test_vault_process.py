"""The process shape: each unlocked vault is served by its own process, which lock ends; a spare
process waits for the next unlock; the local model runs in a model process ended after a vault that
used it locks; a frozen vault process delays nobody else; every child starts isolated.

Real daemons, real vault processes, the real CLI client code (``memories_cli.client.Client``) and
the MCP server's ``DaemonLink``. The canary figures (what memory keeps after lock) are in
tests/test_memory_after_lock.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from memories_cli.client import Client
from memories_cli.mcp_server import DaemonLink
from memoriesd.errors import MemoriesError
from memoriesd.home import Home

from .conftest import Daemon, run_cli, running_daemon
from .procs import alive


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _workers(c: Client) -> dict[str, int]:
    return {w["vault_id"]: int(w["pid"]) for w in c.call("daemon.status")["vault_processes"]}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Daemon, Client]]:
    with running_daemon() as d:
        yield d, Client(Home(d.home), autostart=False)


def test_unlock_starts_a_vault_process_that_serves_it_and_lock_ends_that_process(served: tuple[Daemon, Client]) -> None:
    d, c = served
    vid = c.call("vault.create", {"name": "alpha", "passphrase": "pw alpha"})["vault_id"]
    pid = _workers(c)[vid]
    assert d.proc is not None and pid != d.proc.pid
    rec = c.call("memory.add", {"vault": "alpha", "title": "t", "body": "otters hold hands"})
    assert c.call("memory.search", {"vault": vid, "query": "otters"})["results"][0]["id"] == rec["id"]
    assert [v["locked"] for v in c.call("vault.list")["vaults"] if v["vault_id"] == vid] == [False]
    assert c.call("vault.status", {"vault": vid})["records"] == 1
    assert c.call("vault.lock", {"vault": vid}) == {"locked": [vid], "already_locked": []}
    assert _gone(pid), "the vault's process outlived its lock"
    assert vid not in _workers(c)
    with pytest.raises(MemoriesError) as err:
        c.call("memory.search", {"vault": vid, "query": "otters"})
    assert err.value.code == "vault_locked" and err.value.message == "vault alpha is locked: run `memories vault unlock alpha`"
    assert c.call("vault.status", {"vault": vid})["locked"] is True
    # A new process reads what the old one wrote; a new passphrase is set by the vault's process too.
    c.call("vault.passwd", {"vault": vid, "old": "pw alpha", "new": "pw beta"})
    c.call("vault.unlock", {"vault": vid, "passphrase": "pw beta"})
    assert _workers(c)[vid] != pid
    assert c.call("memory.read", {"vault": vid, "id": rec["id"]})["body"] == "otters hold hands"
    c.call("vault.lock", {"all": True})


def test_a_wrong_passphrase_leaves_no_vault_process(served: tuple[Daemon, Client]) -> None:
    _d, c = served
    vid = c.call("vault.create", {"name": "bravo", "passphrase": "right"})["vault_id"]
    c.call("vault.lock", {"vault": vid})
    with pytest.raises(MemoriesError) as err:
        c.call("vault.unlock", {"vault": vid, "passphrase": "wrong"})
    assert err.value.code == "bad_passphrase"
    deadline = time.monotonic() + 10
    while vid in _workers(c):
        assert time.monotonic() < deadline, "a vault process stayed after a failed unlock"
        time.sleep(0.05)
    c.call("vault.unlock", {"vault": vid, "passphrase": "right"})  # right away: the ending process is waited for
    c.call("vault.lock", {"vault": vid})


def test_the_main_socket_refuses_vault_content_for_a_vault_served_by_its_process(served: tuple[Daemon, Client]) -> None:
    d, c = served
    vid = c.call("vault.create", {"name": "charlie", "passphrase": "pw"})["vault_id"]
    with d.connect() as main:  # an old client writing to the main socket
        err = d.request("memory.add", {"vault": vid, "title": "x", "body": "y"}, sock=main)["error"]
        assert err["code"] == "protocol_error" and "vault.route" in err["message"]
        assert d.request("vault.unlock", {"vault": vid, "passphrase": "pw"}, sock=main)["error"]["code"] == "protocol_error"
    c.call("vault.lock", {"vault": vid})


def test_a_crashed_vault_process_reports_the_vault_locked_and_keeps_acknowledged_writes(served: tuple[Daemon, Client]) -> None:
    d, c = served
    vid = c.call("vault.create", {"name": "delta", "passphrase": "pw"})["vault_id"]
    ids = [c.call("memory.add", {"vault": vid, "title": f"n{i}", "body": f"durable {i}"})["id"] for i in range(5)]
    pid = _workers(c)[vid]
    os.kill(pid, signal.SIGKILL)  # a child of the daemon this test started
    assert _gone(pid)
    with pytest.raises(MemoriesError) as err:
        c.call("memory.list", {"vault": vid})
    assert err.value.code == "vault_locked" and "\n" not in err.value.message
    assert [v["locked"] for v in c.call("vault.list")["vaults"] if v["vault_id"] == vid] == [True]
    deadline = time.monotonic() + 10  # the daemon logs the end from the thread that reaps the process
    while "ended unexpectedly" not in d.log_text():
        assert time.monotonic() < deadline, "the daemon did not log the vault process's end"
        time.sleep(0.05)
    c.call("vault.unlock", {"vault": vid, "passphrase": "pw"})
    assert sorted(r["id"] for r in c.call("memory.list", {"vault": vid})["records"]) == sorted(ids)
    c.call("vault.lock", {"vault": vid})


def test_an_mcp_grant_is_served_by_the_vault_process_and_follows_lock_and_unlock(served: tuple[Daemon, Client]) -> None:
    _d, c = served
    vid = c.call("vault.create", {"name": "echo", "passphrase": "pw"})["vault_id"]
    c.call("memory.add", {"vault": vid, "title": "pets", "body": "the hamster is called Biscuit"})
    token = c.call("grant.create", {"vault": vid, "scopes": ["search"]})["token"]
    assert [g["vault_id"] for g in c.call("grant.list")["grants"]] == [vid]
    link = DaemonLink(Home(c.home.root), token)
    try:
        assert link.call("memory.search", {"query": "hamster"})["results"]
        c.call("vault.lock", {"vault": vid})
        with pytest.raises(MemoriesError) as err:
            link.call("memory.search", {"query": "hamster"})
        assert err.value.code == "vault_locked" and "memories vault unlock" in err.value.message
        c.call("vault.unlock", {"vault": vid, "passphrase": "pw"})
        assert link.call("memory.search", {"query": "hamster"})["results"]  # the new process, the same grant
        with pytest.raises(MemoriesError) as err:
            link.call("memory.read", {"id": "x"})
        assert err.value.code == "scope_denied"
    finally:
        link.close()
    grant_id = c.call("grant.list", {"vault": vid})["grants"][0]["grant_id"]
    assert c.call("grant.revoke", {"grant_id": grant_id})["revoked"] == [grant_id]
    c.call("vault.lock", {"vault": vid})


def test_auto_lock_daemon_stop_and_a_killed_daemon_all_end_the_vault_processes() -> None:
    with running_daemon("[daemon]\nauto_lock_minutes = 0.01\n") as d:  # 0.6 s idle
        c = Client(Home(d.home), autostart=False)
        vid = c.call("vault.create", {"name": "foxtrot", "passphrase": "pw"})["vault_id"]
        pid = _workers(c)[vid]
        assert _gone(pid), "auto-lock did not end the vault's process"
        assert "locked (auto-lock)" in d.log_text()
        c.call("vault.unlock", {"vault": vid, "passphrase": "pw"})
        pid = _workers(c)[vid]
        assert d.stop() == 0
        assert _gone(pid), "daemon stop left a vault process"
        assert not list((d.home / "run").glob("w*.sock"))
        d.start()
        c.call("vault.unlock", {"vault": vid, "passphrase": "pw"})
        pid = _workers(c)[vid]
        d.kill9(everything=False)  # the daemon dies without a word: the vault's process locks and exits on its own
        assert _gone(pid), "a vault process outlived its daemon"


def test_the_cli_works_through_vault_processes(served: tuple[Daemon, Client]) -> None:
    d, c = served
    r = run_cli(d.home, "vault", "create", "golf", "--passphrase-stdin", input="pw golf\n")
    assert r.returncode == 0, r.stderr
    c.call("memory.add", {"vault": "golf", "title": "note", "body": "walrus tusks"})
    r = run_cli(d.home, "--json", "memory", "search", "golf", "walrus")
    assert r.returncode == 0 and "walrus" in r.stdout, r.stderr
    c.call("vault.lock", {"vault": "golf"})
    r = run_cli(d.home, "memory", "search", "golf", "walrus")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "locked" in r.stderr, r.stderr
