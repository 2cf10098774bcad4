"""Budgeted and cancellable embedding passes (`rag index`), with a slow loopback embedding service."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from .conftest import Daemon, create_vault, run_cli, short_tmpdir, write_config
from .servers import Mirror, Scripted

EMBED = "/v1/embeddings"


def _answer(n: int, hold: threading.Event | None = None) -> Scripted:
    return Scripted.json(200, {"data": [{"index": i, "embedding": [1.0, float(i % 7), 0.5]} for i in range(n)]}, hold=hold)


def _wait(what: str, cond: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def index_while(
    d: Daemon, server: Mirror, vid: str, held: threading.Event, action: Callable[[], object], budget: float | None = None
) -> dict:
    """Run rag.index in a thread, do ``action`` while its first embedding request is held in flight
    (``held`` is that request's gate), then let the request answer."""
    result: dict = {}
    params = {"vault": vid} if budget is None else {"vault": vid, "budget_seconds": budget}
    t = threading.Thread(target=lambda: result.update(msg=d.request("rag.index", params)))
    t.start()
    try:
        _wait("the first embedding request", lambda: server.seen(EMBED))
        action()
    finally:
        held.set()
        t.join(60)
    return result["msg"]


@pytest.fixture
def slow() -> Iterator[tuple[Daemon, Mirror, str]]:
    with Mirror() as server:
        root = short_tmpdir()
        home = root / "h"
        write_config(
            home,
            f'[embedding.service]\nprotocol = "compatible"\nurl = "{server.url}{EMBED}"\nmodel = "e"\ndimensions = 3\n'
            "[http]\nretries = 0\ntimeout_seconds = 60\n",  # held requests wait for the test, not the clock
        )
        d = Daemon(home).start()
        vid = create_vault(d)
        for i in range(70):  # 3 batches of at most 32 fragments
            d.call("memory.add", {"vault": vid, "body": f"note {i} about things"})
        yield d, server, vid
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_budget_ends_a_pass_between_batches_and_keeps_finished_ones(slow: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = slow
    held = threading.Event()
    server.add(EMBED, _answer(32, held), _answer(32), _answer(6))

    def budget_spent() -> None:  # the first batch answers only after the pass's budget is spent
        time.sleep(0.5)

    out = index_while(d, server, vid, held, budget_spent, budget=0.5)["result"]
    assert out["embedded"] == 32 and out["remaining"] == 38
    # The CLI repeats budgeted passes until everything is embedded.
    r = run_cli(d.home, "--json", "rag", "index", vid)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == 70
    assert d.call("rag.status", {"vault": vid})["embedding"]["embedded"] == 70


def test_lock_during_indexing_cancels_and_discards_the_late_batch(slow: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = slow
    held = threading.Event()
    server.add(EMBED, _answer(32, held))

    def lock() -> None:
        # Lock waits for the pass, whose batch is held: the batch answers once the lock has begun.
        locker = threading.Thread(target=lambda: d.call("vault.lock", {"vault": vid}))
        locker.start()
        _wait("the lock to begin", lambda: d.request("memory.list", {"vault": vid}).get("error", {}).get("code") == "vault_locked")
        held.set()
        locker.join(60)
        assert d.call("vault.status", {"vault": vid})["locked"]

    msg = index_while(d, server, vid, held, lock)
    assert msg["error"]["code"] == "cancelled"
    d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    server.add(EMBED, _answer(32), _answer(32), _answer(6))
    assert d.call("rag.index", {"vault": vid})["embedded"] == 70  # nothing of the late batch was kept


def test_vault_change_during_indexing_ends_the_pass_without_keeping_the_stale_batch(slow: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = slow
    held = threading.Event()
    server.add(EMBED, _answer(32, held))
    msg = index_while(d, server, vid, held, lambda: d.call("memory.add", {"vault": vid, "body": "a new note"}))
    out = msg["result"]
    assert out["changed"] is True and out["embedded"] == 0 and out["remaining"] == 70
    assert d.call("rag.status", {"vault": vid})["embedding"]["embedded"] == 0


def test_cli_index_goes_on_across_a_vault_change(slow: tuple[Daemon, Mirror, str]) -> None:
    d, server, vid = slow
    held = threading.Event()
    server.add(EMBED, _answer(32, held), _answer(32), _answer(32), _answer(7))
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=run_cli(d.home, "--json", "rag", "index", vid)))
    t.start()
    try:
        _wait("the first embedding request", lambda: server.seen(EMBED))
        d.call("memory.add", {"vault": vid, "body": "a note written while indexing"})  # while that request is held
    finally:
        held.set()
        t.join(120)
    r = result["r"]
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["embedded"] == 71 and out["total"] == 71
    assert d.call("rag.status", {"vault": vid})["embedding"]["embedded"] == 71
