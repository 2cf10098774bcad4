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
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.errors import MemoriesError

from .conftest import short_tmpdir
from .test_vectors import make_entries, store

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
