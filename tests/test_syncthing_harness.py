"""The Syncthing harness really syncs: two real Syncthing instances on 127.0.0.1 carry a file written
in one folder, complete, to the other, both ways, and carry a deletion."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.sync.transport import FolderTransport
from tests.support.syncthing import DEADLINE, SYNCTHING_MISSING, SyncthingPair, syncthing_program

pytestmark = pytest.mark.skipif(syncthing_program() is None, reason=SYNCTHING_MISSING)

NAME = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncthingPair]:
    work = tmp_path_factory.mktemp("syncthing")
    with SyncthingPair(work / "homes", work / "A", work / "B") as p:
        yield p


def _has(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except FileNotFoundError:
        return False


def test_a_file_written_under_a_appears_complete_under_b_and_back(pair: SyncthingPair) -> None:
    a, b = pair.a.folder, pair.b.folder
    there = os.urandom(300_000)
    FolderTransport(a).write(NAME, there)
    pair.wait_until(lambda: _has(b / NAME, there), DEADLINE, "the file written under A arriving under B")
    back = os.urandom(1000)
    FolderTransport(b).write("memories-sync.json", back)
    pair.scan()
    pair.wait_until(
        lambda: _has(a / "memories-sync.json", back), DEADLINE, "the file written under B arriving under A"
    )
    names = {e.name for e in FolderTransport(b).list()}
    assert {NAME, "memories-sync.json"} <= names


def test_a_file_deleted_under_a_disappears_under_b(pair: SyncthingPair) -> None:
    a, b = pair.a.folder, pair.b.folder
    name = "f" * 32
    FolderTransport(a).write(name, b"to be forgotten")
    pair.wait_until(lambda: _has(b / name, b"to be forgotten"), DEADLINE, "the file arriving under B")
    FolderTransport(a).delete(name)
    pair.wait_until(lambda: not (b / name).exists(), DEADLINE, "the deletion under A reaching B")
    assert not (a / name).exists()


def test_the_pair_settles_with_the_same_files_on_both_sides(pair: SyncthingPair) -> None:
    a, b = pair.a.folder, pair.b.folder
    for i in range(5):
        FolderTransport(a if i % 2 else b).write(f"{i:032x}", os.urandom(10_000 + i))
    pair.scan()
    pair.wait_until(pair.settled, DEADLINE, "both Syncthing instances settling")

    def files(root: Path) -> dict[str, bytes]:
        return {
            e.name: (root / e.name).read_bytes()
            for e in FolderTransport(root).list()
            if not e.name.startswith(".")
        }

    assert files(a) == files(b) and {f"{i:032x}" for i in range(5)} <= set(files(a))
