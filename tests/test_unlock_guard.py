"""Unlock under attack, with the default Argon2id parameters and real concurrency.

The default KDF (64 MiB, 3 passes, 4 lanes) is the setting at risk here: two derivations at once
in threads never returned on this machine kind, and a cheap 1-lane KDF never showed it.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator

from memoriesd.vault.manager import FAILURES_NAME

from .conftest import Daemon, DaemonError, short_tmpdir

PW = "correct horse"


@contextlib.contextmanager
def _daemon_with(vault_cfg: str) -> Iterator[Daemon]:
    """A daemon on a fresh home whose config.toml is exactly ``vault_cfg`` (no cheap KDF: the
    production defaults unless given); stopped and removed after."""
    root = short_tmpdir("ug")
    home = root / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(vault_cfg)
    d = Daemon(home).start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _code(d: Daemon, method: str, params: dict[str, object]) -> str | None:
    try:
        d.call(method, params)
        return None
    except DaemonError as exc:
        return exc.code


def test_parallel_unlocks_with_the_default_kdf_all_return() -> None:
    with _daemon_with("") as d:
        ids = [d.call("vault.create", {"name": f"v{i}", "passphrase": PW})["vault_id"] for i in range(2)]
        d.call("vault.lock", {"all": True})
        results: list[str | None] = []

        def attempt(vid: str, pw: str) -> None:
            results.append(_code(d, "vault.unlock", {"vault": vid, "passphrase": pw}))

        threads = [threading.Thread(target=attempt, args=(ids[i % 2], PW if i < 4 else "wrong")) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "an unlock never returned (concurrent Argon2id)"
        assert sorted(results, key=str) == sorted([None] * 4 + ["bad_passphrase"] * 2, key=str)
        # The daemon still derives keys afterwards, and still stops on SIGTERM.
        d.call("vault.lock", {"all": True})
        d.call("vault.unlock", {"vault": ids[0], "passphrase": PW})
        assert d.stop() == 0


def test_a_wrong_passphrase_is_refused_even_when_the_vault_is_unlocked() -> None:
    with _daemon_with("[vault]\nkdf_memory_kib = 64\nkdf_iterations = 1\nkdf_lanes = 1\n") as d:
        vid = d.call("vault.create", {"name": "open", "passphrase": PW})["vault_id"]
        assert _code(d, "vault.unlock", {"vault": vid, "passphrase": "wrong"}) == "bad_passphrase"
        assert d.call("vault.unlock", {"vault": vid, "passphrase": PW})["locked"] is False
        assert d.call("vault.status", {"vault": vid})["locked"] is False  # still unlocked


def test_parallel_wrong_guesses_wait_one_after_another_and_the_count_survives_a_restart() -> None:
    cfg = "[vault]\nkdf_memory_kib = 64\nkdf_iterations = 1\nkdf_lanes = 1\nunlock_delay_step_ms = 300\nunlock_delay_max_ms = 5000\n"
    with _daemon_with(cfg) as d:
        vid = d.call("vault.create", {"name": "g", "passphrase": PW})["vault_id"]
        d.call("vault.lock", {"all": True})
        codes: list[str | None] = []
        t0 = time.monotonic()
        threads = [threading.Thread(target=lambda: codes.append(_code(d, "vault.unlock", {"vault": vid, "passphrase": "nope"}))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
        assert codes == ["bad_passphrase"] * 4
        # Serialised: the delays add up (0 + 300 + 600 + 900 ms), they do not overlap.
        assert elapsed >= 1.7, elapsed
        d.stop()
        d.start()  # the same home: the failure count was kept on disk
        # After a restart the fifth attempt still waits 4 x 300 ms, even with the right passphrase.
        t0 = time.monotonic()
        d.call("vault.unlock", {"vault": vid, "passphrase": PW})
        assert time.monotonic() - t0 >= 1.1
        # A success resets the count (kept on disk beside the vault): the next unlock waits for nothing.
        assert (d.home / "vaults" / vid / FAILURES_NAME).exists() is False
        d.call("vault.lock", {"all": True})
        d.call("vault.unlock", {"vault": vid, "passphrase": PW})


def test_passwd_with_a_wrong_old_passphrase_counts_as_a_failed_attempt() -> None:
    cfg = "[vault]\nkdf_memory_kib = 64\nkdf_iterations = 1\nkdf_lanes = 1\nunlock_delay_step_ms = 400\n"
    with _daemon_with(cfg) as d:
        vid = d.call("vault.create", {"name": "p", "passphrase": PW})["vault_id"]
        assert _code(d, "vault.passwd", {"vault": vid, "old": "wrong", "new": "x"}) == "bad_passphrase"
        t0 = time.monotonic()
        assert _code(d, "vault.passwd", {"vault": vid, "old": "wrong again", "new": "x"}) == "bad_passphrase"
        assert time.monotonic() - t0 >= 0.35
        d.call("vault.passwd", {"vault": vid, "old": PW, "new": "new phrase"})
        d.call("vault.lock", {"all": True})
        d.call("vault.unlock", {"vault": vid, "passphrase": "new phrase"})
