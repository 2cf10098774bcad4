"""The embedding queue's fairness (memoriesd.embed.schedule): the vault in use, then small before large.

The daemon test runs two vaults' background indexing at once through the real model process and
reads the order in which the model process started their batches (``ORDER_ENV``), never timings.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from memoriesd.embed.schedule import BACKGROUND, FOREGROUND, QUERY, EmbedQueue, Hint, rank
from memoriesd.rag.background import HOLD_ENV
from memoriesd.workers.model import ORDER_ENV

from .conftest import Daemon, create_vault, running_daemon
from .tinymodel import make_tiny_model

WORDS = "cat dog coffee tea mountain river piano guitar bank money doctor vault key search lamp boat".split()


def _folder(root: Path, name: str, n: int) -> Path:
    folder = root / name
    folder.mkdir()
    for i in range(n):
        body = " ".join(WORDS[(i * 5 + j * 3 + len(name)) % len(WORDS)] for j in range(40))
        (folder / f"{name}{i:04d}.md").write_text(f"# {name} note {i}\n\n{body} {name} {i}\n")
    return folder


def _state(d: Daemon, vid: str) -> dict[str, Any]:
    return dict(d.call("rag.status", {"vault": vid})["embedding"])


def _wait(d: Daemon, vids: list[str], state: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_state(d, v).get("state") == state for v in vids):
            return
        time.sleep(0.1)
    raise AssertionError(f"background indexing did not reach {state}: {[_state(d, v) for v in vids]}")


def test_a_small_vault_is_embedded_before_a_large_one_that_started_first(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=1)
    hold, order = tmp_path / "hold", tmp_path / "order"
    hold.touch()  # both jobs wait "running" before their first chunk until this file goes
    env = {HOLD_ENV: str(hold), ORDER_ENV: str(order)}
    with running_daemon(f'[embedding.local]\nmodel_dir = "{model}"\n', env=env) as d:
        large = create_vault(d, "large")
        d.call(
            "rag.ingest", {"vault": large, "paths": [str(_folder(tmp_path, "large", 240))], "recursive": True}
        )
        small = create_vault(d, "small")
        d.call(
            "rag.ingest", {"vault": small, "paths": [str(_folder(tmp_path, "small", 48))], "recursive": True}
        )
        _wait(d, [large, small], "running")
        hold.unlink()
        _wait(d, [large, small], "done")
        assert _state(d, small)["embedded"] == _state(d, small)["total"] > 0
    batches = [line.split() for line in order.read_text().splitlines()]
    who = [vault for vault, lane, _ in batches if lane == BACKGROUND]
    assert set(who) == {large, small}, batches
    first_small, last_small = who.index(small), len(who) - 1 - who[::-1].index(small)
    # Completion order: the small vault's last batch ran before the large vault's last one.
    assert last_small < len(who) - 1 - who[::-1].index(large)
    # And it did not share the model: once its first batch was in, no batch of the large vault ran
    # until the small vault had nothing left (at most the large vault's batch already queued).
    between = who[first_small : last_small + 1].count(large)
    assert between <= 1, who


def test_the_policy_ranks_queries_then_foreground_then_the_vault_in_use_then_the_smaller() -> None:
    assert rank(Hint(QUERY)) < rank(Hint(FOREGROUND, 10_000)) < rank(Hint(BACKGROUND, 1, 0.0))
    in_use_large = rank(Hint(BACKGROUND, 15_000, idle_seconds=5.0))
    idle_small = rank(Hint(BACKGROUND, 2_000, idle_seconds=3_600.0))
    assert in_use_large < idle_small
    assert rank(Hint(BACKGROUND, 2_000, 5.0)) < in_use_large


def _runner(
    queue: EmbedQueue, vault: str, hint: Hint, started: list[str], release: threading.Event
) -> threading.Thread:
    def run() -> None:
        with queue.turn(vault, hint):
            started.append(vault)
            release.wait(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait_waiting(queue: EmbedQueue, n: int) -> None:
    deadline = time.monotonic() + 30
    while queue.waiting() < n:
        assert time.monotonic() < deadline, "the batches never queued"
        time.sleep(0.005)


def test_a_search_moves_its_vault_ahead_of_an_idle_one_in_the_queue() -> None:
    now = [0.0]
    queue = EmbedQueue(clock=lambda: now[0])
    started: list[str] = []
    gate = threading.Event()
    first = _runner(queue, "busy", Hint(FOREGROUND), started, gate)  # holds the model
    while not started:
        time.sleep(0.005)
    now[0] = 1_000.0
    idle_small = _runner(queue, "idle", Hint(BACKGROUND, 10, idle_seconds=3_600.0), started, gate)
    _wait_waiting(queue, 1)
    used_large = _runner(queue, "used", Hint(BACKGROUND, 5_000, idle_seconds=3_600.0), started, gate)
    _wait_waiting(queue, 2)
    queue.used("used")  # a query of that vault arrived meanwhile: it is in use now
    gate.set()
    first.join(30)
    while len(started) < 2:
        time.sleep(0.005)
    # The large vault in use keeps its place between batches; the idle one runs once that claim lapses.
    now[0] = 1_000.0 + 11.0
    for t in (idle_small, used_large):
        t.join(30)
    assert started == ["busy", "used", "idle"]


def test_a_vault_between_its_batches_keeps_its_place_until_its_claim_is_stale() -> None:
    now = [0.0]
    queue = EmbedQueue(claim_seconds=10.0, clock=lambda: now[0])
    with queue.turn("small", Hint(BACKGROUND, 8, 0.0)):
        pass  # the small vault's batch ended: more to come
    done = threading.Event()

    def large() -> None:
        with queue.turn("large", Hint(BACKGROUND, 900, 0.0)):
            done.set()

    t = threading.Thread(target=large, daemon=True)
    t.start()
    _wait_waiting(queue, 1)
    assert not done.is_set()  # held behind the small vault's fresh claim (the clock stands still)
    now[0] = 11.0  # the small vault sent nothing more for longer than a claim lasts
    assert done.wait(30)
    t.join(30)
    with queue.turn("small", Hint(BACKGROUND, 0, 0.0)):
        pass  # its last batch: nothing is held for it afterwards
    with queue.turn("large", Hint(BACKGROUND, 800, 0.0)):
        pass


def test_a_background_chunk_takes_the_fragments_of_most_alike_length() -> None:
    from memoriesd.rag.background import like_lengths

    lengths = {1: 200, 2: 40, 3: 198, 4: 41, 5: 199, 6: 39, 7: 120, 8: 42}
    # 39/40/41 pad 3 tokens (198/199/200 too: the shorter run wins the tie)
    assert like_lengths(lengths, 3) == [2, 4, 6]
    assert like_lengths({k: v for k, v in lengths.items() if v < 100 or v > 150} | {2: 90}, 3) == [1, 3, 5]
    assert like_lengths(lengths, 4) == [2, 4, 6, 8]  # 39..42: 6 tokens of padding
    assert like_lengths({1: 5}, 8) == [1]
