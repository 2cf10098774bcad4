"""ENOSPC and EIO at every write step, and a real full tmpfs under a real daemon (issue 18, item 2).

The engine is ``tests/support/io_errors.py``: the seam ``memoriesd/vault/fsio.py`` fails one
write step of vault ``main`` (``ENOSPC`` stays, like a full disk; ``EIO`` strikes once); the client
must get a one-line ``io_error`` (or the operation succeeds where the step was best-effort), vault
``other`` keeps working, memory agrees with the disk, a failed log fsync leaves the vault refusing
writes until lock and unlock, and the reopened vault holds an acknowledged state. Short mode here:
4 random steps per scenario and error; the report runs every step.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Daemon, DaemonError, create_vault, short_tmpdir, write_config
from .support import io_errors, scenarios


@pytest.fixture
def quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    yield None
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", [s.name for s in scenarios.SCENARIOS])
def test_enospc_and_eio_at_a_write_step_answer_one_line_and_keep_the_old_state(name: str, quiet: None) -> None:
    got = io_errors.run_scenario(scenarios.by_name([name])[0], steps=4, seed=18)
    assert got["write_steps"] >= 4, got
    for err in io_errors.ERRORS:
        r = got[err]
        assert r["failures"] == [], r
        assert r["reached"] == r["cases"] == 4
        assert (r["crashes"], r["acknowledged_records_lost"]) == (0, 0)
        assert r["survived"] == r["cases"]


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """None when mounted, else why not (not root, no mount permission)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True, text=True)
    return None if r.returncode == 0 else f"mount -t tmpfs is not permitted here: {r.stderr.strip()}"


def test_a_full_real_tmpfs_answers_io_error_keeps_the_vault_and_other_vaults_serve(tmp_path: Path) -> None:
    home = short_tmpdir("io")
    write_config(home)
    d = Daemon(home).start()
    mounted = None
    try:
        vid = create_vault(d, "full")
        other = create_vault(d, "other")
        kept = d.call("memory.add", {"vault": vid, "title": "kept", "body": "written before the disk filled"})["id"]
        d.call("vault.lock", {"vault": vid})
        vdir = home / "vaults" / vid
        saved = {p.name: p.read_bytes() for p in vdir.iterdir()}
        why = _mount_tmpfs(vdir, "256k")
        if why is not None:
            pytest.skip(why)
        mounted = vdir
        for name, data in saved.items():
            (vdir / name).write_bytes(data)
            os.chmod(vdir / name, 0o600)
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        # Fill the file system to the brim.
        fd = os.open(vdir / ".filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(DaemonError) as ei:
            d.call("memory.add", {"vault": vid, "title": "big", "body": "x " * 60_000})
        assert ei.value.code == "io_error" and "\n" not in ei.value.message
        assert "No space left on device" in ei.value.message
        # The other vault keeps serving, reads and writes.
        oid = d.call("memory.add", {"vault": other, "title": "o", "body": "still served"})["id"]
        assert d.call("memory.read", {"vault": other, "id": oid})["body"] == "still served"
        # The full vault still reads its old state; with space again it writes without a restart.
        assert d.call("memory.read", {"vault": vid, "id": kept})["body"] == "written before the disk filled"
        (vdir / ".filler").unlink()
        d.call("memory.add", {"vault": vid, "title": "after", "body": "space again"})
        d.call("vault.lock", {"vault": vid})
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        titles = sorted(r["title"] for r in d.call("memory.list", {"vault": vid})["records"])
        assert titles == ["after", "kept"]
    finally:
        d.stop()
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)
        subprocess.run(["rm", "-rf", str(home)], check=False)
