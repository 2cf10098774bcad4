"""Three paths that used to lose data without a word (issue 28, item 8), each with a real failure.

- A vector file that cannot be read (a real ``EACCES`` from the kernel) is never replaced by the
  next append: the append fails with one line, every sealed vector stays; only a file this
  module finds damaged is started over, and the log says so.
- A damaged vector space list never makes ``memory forget`` delete vector files: they are kept,
  the log and the user are told.
- ``vault delete`` with a keyring whose delete fails says the remembered key could not be
  removed (and what to do), and the log says so, without the key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.errors import MemoriesError
from memoriesd.index.vectors.names import (
    SPACES_NAME,
    SpacesDamaged,
    list_sidecars,
    read_spaces,
    register_in_spaces,
    write_spaces,
)

from .conftest import REPO, Daemon, cli_json, run_cli, short_tmpdir, write_config
from .test_forget import _add, _daemon
from .test_vectors import KEY, StdlibSeal, make_entries, store

NOBODY = 65534


@contextlib.contextmanager
def unreadable(path: Path) -> Iterator[None]:
    """``path`` cannot be opened for reading (the kernel answers ``EACCES``) while its directory
    stays writable. Root reads any file, so then this process acts as an unprivileged user
    (effective uid) meanwhile."""
    mode, dir_mode = path.stat().st_mode, path.parent.stat().st_mode
    os.chmod(path, 0o200)
    root = os.geteuid() == 0
    if root:
        os.chmod(path.parent, 0o777)
        os.seteuid(NOBODY)
    try:
        with pytest.raises(PermissionError):
            path.read_bytes()  # the fault is real
        yield None
    finally:
        if root:
            os.seteuid(0)
            os.chmod(path.parent, dir_mode)
        os.chmod(path, mode)


def test_an_append_never_replaces_a_vector_file_it_cannot_read() -> None:
    d = short_tmpdir("vl")
    try:
        path = d / "vectors-0123456789abcdef.bin"
        sealed = make_entries(300)
        store(path).append(sealed)
        before = path.read_bytes()
        fresh = store(path)  # not read yet, as after a restart
        with unreadable(path), pytest.raises(MemoriesError) as err:
            fresh.append(make_entries(3, seed=1, prefix="new"))
        assert err.value.code == "vector_store_failed"
        assert "\n" not in err.value.message and "Permission denied" in err.value.message
        assert path.read_bytes() == before
        assert store(path).load().keys() == sealed.keys()
    finally:
        shutil.rmtree(d)


def test_an_append_to_a_damaged_vector_file_starts_over_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "vectors-0123456789abcdef.bin"
    store(path).append(make_entries(40))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # the last chunk fails authentication
    path.write_bytes(bytes(data))
    new = make_entries(3, seed=1, prefix="new")
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        store(path).append(new)
    assert store(path).load().keys() == new.keys()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(path.name in m and "damaged" in m and "recomputed" in m for m in warned), warned


def test_forget_with_a_damaged_vector_space_list_keeps_every_vector_file_and_says_so() -> None:
    with _daemon() as (d, vid):
        gone = _add(d, vid, "Ferry", "The ferry to the island leaves at seven.")
        _add(d, vid, "Tea", "The user likes green tea in the afternoon.")
        d.call("rag.index", {"vault": vid})
        vdir = d.home / "vaults" / vid
        sidecars = {p.name: p.read_bytes() for p in list_sidecars(vdir)}
        assert sidecars
        spaces = bytearray((vdir / SPACES_NAME).read_bytes())
        spaces[-3] ^= 0xFF  # no longer opens
        (vdir / SPACES_NAME).write_bytes(bytes(spaces))
        out = cli_json(d.home, "memory", "forget", vid, "--id", gone, "--yes")
        assert out["forgotten"] == 1 and out["vector_files_removed"] == 0
        assert {p.name for p in list_sidecars(vdir)} == set(sidecars)
        assert any("vector" in n and "kept" in n and "damaged" in n for n in out["notices"]), out["notices"]
        log = d.log_text()
        assert "vector space list" in log and "kept" in log


def test_a_space_list_written_again_after_damage_still_keeps_other_models_vector_files(tmp_path: Path) -> None:
    seal = StdlibSeal(KEY)
    a, b = "a" * 32, "b" * 32
    for oid in (a, b):
        (tmp_path / f"vectors-{oid}.bin").write_bytes(b"sealed vectors")
    write_spaces(tmp_path, {a: {"identity": "model-a", "dims": 24}, b: {"identity": "model-b", "dims": 24}},
                 vault_id="v", seal=seal.seal)
    (tmp_path / SPACES_NAME).write_bytes((tmp_path / SPACES_NAME).read_bytes()[:-1])  # damaged
    with pytest.raises(SpacesDamaged):
        read_spaces(tmp_path, vault_id="v", open_=seal.open, strict=True)
    # The vault uses model a again (unlock): the list is written again, naming a only.
    register_in_spaces(tmp_path, a, {"identity": "model-a", "dims": 24}, vault_id="v", seal=seal.seal, open_=seal.open)
    assert set(read_spaces(tmp_path, vault_id="v", open_=seal.open)) == {a}
    with pytest.raises(SpacesDamaged):  # b's file is not named: forget must keep it, not delete it
        read_spaces(tmp_path, vault_id="v", open_=seal.open, strict=True)
    register_in_spaces(tmp_path, b, {"identity": "model-b", "dims": 24}, vault_id="v", seal=seal.seal, open_=seal.open)
    assert set(read_spaces(tmp_path, vault_id="v", open_=seal.open, strict=True)) == {a, b}  # whole again


@contextlib.contextmanager
def _failing_keyring_daemon(backend: str) -> Iterator[tuple[Daemon, Path]]:
    """A daemon whose OS keyring (``backend`` in tests/memkeyring.py) stores a key but then fails."""
    root = short_tmpdir("kr")
    home, ring = root / "h", root / "keyring.json"
    write_config(home)
    env = {"PYTHON_KEYRING_BACKEND": f"tests.memkeyring.{backend}", "PYTHONPATH": str(REPO),
           "MEMORIES_TEST_KEYRING": str(ring)}
    d = Daemon(home, env=env).start()
    try:
        yield d, ring
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _remembered_vault(d: Daemon, ring: Path) -> tuple[str, str]:
    """A vault remembered in the keyring: its id and the key the keyring holds."""
    r = run_cli(d.home, "vault", "create", "kr", "--passphrase-stdin", "--remember", input="pw\n")
    assert r.returncode == 0 and "keyring" not in r.stderr, r.stderr
    vid = r.stdout.strip().splitlines()[-1]
    (stored,) = json.loads(ring.read_text()).values()
    return vid, stored


def test_vault_delete_says_when_the_remembered_key_stays_in_the_keyring() -> None:
    with _failing_keyring_daemon("DeleteFailingFileKeyring") as (d, ring):
        vid, key = _remembered_vault(d, ring)
        r = run_cli(d.home, "vault", "delete", vid, "--yes")
        assert r.returncode == 0, r.stderr
        assert not (d.home / "vaults" / vid).exists()
        assert [key] == list(json.loads(ring.read_text()).values())  # the keyring really still holds it
        warning = [line for line in r.stderr.splitlines() if "keyring" in line]
        assert len(warning) == 1 and "could not be removed" in warning[0] and vid in warning[0], r.stderr
        out = cli_json(d.home, "vault", "create", "kr2", "--passphrase-stdin", input="pw\n")
        out = cli_json(d.home, "vault", "delete", out["vault_id"], "--yes")
        assert "notices" not in out  # nothing was remembered for that one (the keyring says so): nothing to say
        log = d.log_text()
        assert f"vault {vid}" in log and "could not be removed from the OS keyring" in log
        assert key not in log


def test_unlock_says_the_keyring_could_not_be_read_not_that_no_key_is_remembered() -> None:
    with _failing_keyring_daemon("FailingFileKeyring") as (d, ring):
        vid, key = _remembered_vault(d, ring)
        assert run_cli(d.home, "vault", "lock", vid).returncode == 0
        r = run_cli(d.home, "vault", "unlock", vid)  # no terminal to ask for the passphrase instead
        assert r.returncode == 2, r.stderr
        warning, error = r.stderr.splitlines()
        assert warning.startswith("warning: the OS keyring could not be read") and vid in warning
        assert error.startswith("error[usage]: no terminal to ask for the passphrase")
        assert run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input="pw\n").returncode == 0
        log = d.log_text()
        assert "keyring could not be read" in log and key not in log
