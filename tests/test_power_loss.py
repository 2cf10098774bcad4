"""Simulated power loss at every sync point of every vault write path (issue 18, item 1).

The engine is ``tests/support/power_loss.py`` (``tests/support/reliability_report.py`` runs the
long version): every write, fsync and rename of vault ``main`` goes through the one seam
``memoriesd/vault/fsio.py``, is recorded, and at every fsync/rename the disk is rebuilt as a power
loss may leave it (unsynced writes applied, dropped, torn or garbled; a prefix of the unsynced
directory operations), then opened with the real unlock and recovery code. Short mode here: 100
seeds at 2 random crash points of each scenario and 3 seeds at every other point.
"""

from __future__ import annotations

import logging

import pytest

from .support import power_loss, scenarios


@pytest.fixture(autouse=True)
def _quiet() -> object:
    logging.disable(logging.WARNING)  # recovery warnings by the hundred
    yield None
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", [s.name for s in scenarios.SCENARIOS])
def test_a_power_loss_at_every_sync_point_reopens_the_last_acknowledged_or_the_next_state(name: str) -> None:
    sc = scenarios.by_name([name])[0]
    got = power_loss.run_scenario(sc, 100, points=2, seeds_sampled=3)
    assert got["unrouted_writes"] == [], "a vault file was written outside memoriesd/vault/fsio.py"
    assert got["crash_points"] >= 4 and got["cases"] >= 200 + 3 * (got["crash_points"] - 2)
    assert got["failures"] == [], got
    assert (got["refused"], got["acknowledged_records_lost"], got["crashes"]) == (0, 0, 0)
    assert got["survived"] == got["cases"]


def test_the_model_keeps_fsynced_data_and_loses_or_tears_only_what_was_not_synced(tmp_path: object) -> None:
    import random
    from pathlib import Path

    from memoriesd.vault import fsio

    from .support.fsmodel import DiskModel, RecordingFS

    d = Path(str(tmp_path)) / "v"
    d.mkdir()
    (d / "old").write_bytes(b"old")
    fs = RecordingFS(d)
    with fsio.installed(fs):
        fsio.write_new(d / "a", b"A" * 1500)  # create, write, fsync (no directory fsync yet)
        fd = fsio.open_fd(d / "a", __import__("os").O_WRONLY)
        fsio.pwrite_all(fd, b"B" * 1500, 1500)  # not synced
        fsio.close(fd)
    model = DiskModel.of(fs)
    for op in fs.ops:
        model.step(op)
    assert model.crash(0, random.Random(0)) == {"old": b"old", "a": b"A" * 1500 + b"B" * 1500}
    assert model.crash(1, random.Random(0)) == {"old": b"old"}  # the name was never made durable
    seen = set()
    for s in range(2, 200):
        img = model.crash(s, random.Random(s))
        if "a" in img:
            assert img["a"][:1500] == b"A" * 1500  # the synced part is always there
            seen.add(len(img["a"]))
    assert {1500, 3000} <= seen and len(seen) > 2  # dropped, applied and torn tails all occur
