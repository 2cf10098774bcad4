"""The daemon as a real process: lifecycle, concurrency, crashes, permissions, protocol abuse."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memoriesd.server import protocol

from .conftest import (
    Daemon,
    DaemonError,
    all_file_bytes,
    cli_json,
    create_vault,
    run_cli,
    short_tmpdir,
    write_config,
)


def test_create_unlock_lock_and_restart_is_locked(home: Path) -> None:
    d = Daemon(home).start()
    vid = create_vault(d)
    rid = d.call("memory.add", {"vault": vid, "body": "remember the milk", "title": "shopping"})["id"]
    assert d.call("memory.read", {"vault": vid, "id": rid})["body"] == "remember the milk"
    d.call("vault.lock", {"vault": vid})
    with pytest.raises(DaemonError) as ei:
        d.call("memory.read", {"vault": vid, "id": rid})
    assert ei.value.code == "vault_locked"
    d.call("vault.unlock", {"vault": "personal", "passphrase": "correct horse"})
    assert d.call("memory.read", {"vault": vid, "id": rid})["title"] == "shopping"
    assert d.stop() == 0
    assert not d.socket_path.exists()
    d = Daemon(home).start()
    assert d.call("vault.list")["vaults"][0]["locked"] is True
    with pytest.raises(DaemonError) as ei:
        d.call("memory.list", {"vault": vid})
    assert ei.value.code == "vault_locked"
    d.stop()


def test_auto_lock_after_idle(tmp_path: Path) -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, "[daemon]\nauto_lock_minutes = 0.01\n")  # 0.6 s
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "body": "x"})
        # Nothing touches the vault now (vault.status is no use of it, the log is read from disk).
        deadline = time.monotonic() + 60
        while not (d.call("vault.status", {"vault": vid})["locked"] and "auto-lock" in d.log_text()):
            assert time.monotonic() < deadline, "the idle vault was never auto-locked"
            time.sleep(0.1)
        with pytest.raises(DaemonError) as ei:
            d.call("memory.list", {"vault": vid})
        assert ei.value.code == "vault_locked"
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_eight_concurrent_clients_lose_nothing(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    errors: list[str] = []
    written: dict[int, list[tuple[str, str]]] = {i: [] for i in range(8)}

    def worker(n: int) -> None:
        s = daemon.connect(vid)
        try:
            for j in range(200):
                body = f"client {n} write {j} " + "x" * (j % 50)
                msg = daemon.request("memory.add", {"vault": vid, "body": body, "title": f"c{n}-{j}"}, sock=s)
                if "error" in msg:
                    errors.append(msg["error"]["code"])
                    continue
                rid = msg["result"]["id"]
                written[n].append((rid, body))
                got = daemon.request("memory.read", {"vault": vid, "id": rid}, sock=s)
                if got.get("result", {}).get("body") != body or got["result"]["title"] != f"c{n}-{j}":
                    errors.append("mismatch")
        finally:
            s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    records = daemon.call("memory.list", {"vault": vid})["records"]
    assert len(records) == 1600
    daemon.call("vault.lock", {"vault": vid})
    daemon.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    for n in (0, 7):
        for rid, body in written[n][::37]:
            assert daemon.call("memory.read", {"vault": vid, "id": rid})["body"] == body


def test_wrong_passphrase_slows_down_and_resets(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    daemon.call("vault.lock", {"vault": vid})
    times = []
    for _ in range(4):
        t0 = time.monotonic()
        with pytest.raises(DaemonError) as ei:
            daemon.call("vault.unlock", {"vault": vid, "passphrase": "nope"})
        times.append(time.monotonic() - t0)
        assert ei.value.code == "bad_passphrase"
    assert times[3] >= 0.06  # 3 earlier failures x 20 ms (capped at 100 ms)
    daemon.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    assert "nope" not in daemon.log_text() and "correct horse" not in daemon.log_text()


def test_two_vaults_are_isolated(daemon: Daemon) -> None:
    a = create_vault(daemon, "alpha", "pass-a")
    b = create_vault(daemon, "beta", "pass-b")
    ra = daemon.call("memory.add", {"vault": a, "body": "alpha secret"})["id"]
    with pytest.raises(DaemonError) as ei:
        daemon.call("memory.read", {"vault": b, "id": ra})
    assert ei.value.code == "not_found"
    daemon.call("vault.lock", {"vault": a})
    assert daemon.call("memory.list", {"vault": b})["records"] == []
    with pytest.raises(DaemonError):
        daemon.call("vault.unlock", {"vault": a, "passphrase": "pass-b"})


def test_kill_9_loses_no_acknowledged_write(home: Path) -> None:
    d = Daemon(home).start()
    vid = create_vault(d)
    acknowledged: list[tuple[str, str]] = []
    for round_ in range(4):
        stop_at = time.monotonic() + 0.15 + 0.1 * round_
        s = d.connect(vid)
        try:
            i = 0
            while time.monotonic() < stop_at:
                body = f"round {round_} item {i}"
                msg = d.request("memory.add", {"vault": vid, "body": body}, sock=s)
                acknowledged.append((msg["result"]["id"], body))
                i += 1
            # Fire one more request and kill while it is in flight.
            s.sendall(protocol.encode({"id": 9, "method": "memory.add", "params": {"vault": vid, "body": "in flight"}}))
            d.kill9()
        finally:
            s.close()
        d = Daemon(home).start()
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        bodies = {r["id"] for r in d.call("memory.list", {"vault": vid})["records"]}
        missing = [rid for rid, _ in acknowledged if rid not in bodies]
        assert missing == []
    for rid, body in acknowledged[::25]:
        assert d.call("memory.read", {"vault": vid, "id": rid})["body"] == body
    d.stop()


def test_socket_and_file_permissions(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    daemon.call("memory.add", {"vault": vid, "body": "x"})
    home = daemon.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "run").stat().st_mode) == 0o700
    assert stat.S_IMODE(daemon.socket_path.stat().st_mode) == 0o600
    for p in home.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        if p.is_dir():
            assert mode == 0o700, p
        elif p.name != "config.toml" and not p.is_socket():
            assert mode == 0o600, p


def _connect_as(uid: int, sock_path: Path) -> dict:
    """Fork, drop to ``uid`` in the child, connect and read the daemon's first answer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no exec needed, so any uid works
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(str(sock_path))
            try:
                s.sendall(protocol.encode({"id": 1, "method": "daemon.status", "params": {}}))
            except BrokenPipeError:
                pass  # a refused peer may be cut off before it sends; its answer is still readable
            msg = protocol.recv_frame(s)
            os.write(w, json.dumps(msg).encode())
        except BaseException as exc:  # noqa: BLE001
            os.write(w, json.dumps({"child_error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.getuid() != 0, reason="switching uid needs root (CI runs as root)")
def test_foreign_uid_is_refused_by_peer_credentials(home: Path) -> None:
    """Loosen the file permissions on purpose so only SO_PEERCRED stands between uid 65534 and the daemon."""
    nobody = 65534
    d = Daemon(home).start()
    try:
        for p in (home.parent, home, home / "run"):
            os.chmod(p, 0o711)
        os.chmod(d.socket_path, 0o666)
        msg = _connect_as(nobody, d.socket_path)
        assert msg.get("error", {}).get("code") == "peer_refused", msg
        assert f"refused a connection from uid {nobody}" in d.log_text()
        # The refusal came from the peer check, not the file modes: the same loosened socket serves the owner.
        assert d.call("daemon.status")["pid"] == d.proc.pid  # type: ignore[union-attr]
    finally:
        d.stop()


def test_an_old_config_naming_another_uid_admits_nobody_else(home: Path) -> None:
    """``[daemon] test_allow_uid`` is no longer read: the daemon starts, logs one notice, and keeps its own uid only."""
    write_config(home, "[daemon]\ntest_allow_uid = 65534\n")
    d = Daemon(home).start()
    try:
        assert "[daemon] test_allow_uid is gone" in d.log_text()
        if os.getuid() == 0:
            for p in (home.parent, home, home / "run"):
                os.chmod(p, 0o711)
            os.chmod(d.socket_path, 0o666)
            assert _connect_as(65534, d.socket_path).get("error", {}).get("code") == "peer_refused"
    finally:
        d.stop()


def _raw(daemon: Daemon, data: bytes, read: bool = True, vault: str | None = None) -> dict | None:
    s = daemon.connect(vault)
    try:
        s.sendall(data)
        if not read:
            return None
        s.settimeout(10)
        return protocol.recv_frame(s)
    finally:
        s.close()


def test_malformed_oversized_and_truncated_frames(daemon: Daemon) -> None:
    bad_json = b"{not json"
    assert _raw(daemon, struct.pack(">I", len(bad_json)) + bad_json)["error"]["code"] == "protocol_error"
    not_obj = b"[1,2]"
    assert _raw(daemon, struct.pack(">I", len(not_obj)) + not_obj)["error"]["code"] == "protocol_error"
    bad_utf8 = b'{"id":1,"method":"\xff"}'
    assert _raw(daemon, struct.pack(">I", len(bad_utf8)) + bad_utf8)["error"]["code"] == "protocol_error"
    # Oversized: refused from the length prefix, before any body is sent.
    assert _raw(daemon, struct.pack(">I", 1 << 30))["error"]["code"] == "frame_too_large"
    # Truncated: the client goes away mid-frame.
    _raw(daemon, struct.pack(">I", 100) + b'{"id":', read=False)
    unknown = protocol.encode({"id": 3, "method": "nope.nope", "params": {}})
    assert _raw(daemon, unknown)["error"]["code"] == "unknown_method"
    wrong_type = protocol.encode({"id": 4, "method": "memory.list", "params": {"vault": 5}})
    assert _raw(daemon, wrong_type)["error"]["code"] == "invalid_params"
    params_list = protocol.encode({"id": 5, "method": "vault.list", "params": [1]})
    assert _raw(daemon, params_list)["error"]["code"] == "invalid_params"
    # A slow client holding a half frame does not block others.
    hold = daemon.connect()
    hold.sendall(struct.pack(">I", 50))
    try:
        assert "result" in daemon.request("vault.list")
    finally:
        hold.close()
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert "Traceback" not in daemon.log_text()


def test_lone_surrogates_in_json_are_invalid_params_and_nothing_is_lost(daemon: Daemon) -> None:
    vid = create_vault(daemon, "notes", "pw")
    keep = daemon.call("memory.add", {"vault": vid, "body": "kept note"})["id"]
    payload = json.dumps({"id": 7, "method": "memory.add", "params": {"vault": vid, "title": "\ud800", "body": "b"}})
    data = payload.encode("ascii")  # json.dumps escapes the surrogate as \ud800: valid UTF-8 JSON text
    msg = _raw(daemon, struct.pack(">I", len(data)) + data, vault=vid)  # to the vault's process
    assert msg is not None and msg["error"]["code"] == "invalid_params" and "Unicode" in msg["error"]["message"], msg
    assert [r["id"] for r in daemon.call("memory.list", {"vault": vid})["records"]] == [keep]
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_second_daemon_on_same_home_exits_with_clear_message(daemon: Daemon) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "memoriesd.main", "--home", str(daemon.home)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "already running" in r.stderr and "Traceback" not in r.stderr


def test_stale_socket_and_pid_after_crash_are_cleaned(home: Path) -> None:
    d = Daemon(home).start()
    d.kill9()
    assert d.socket_path.exists()
    r = run_cli(home, "daemon", "status")
    assert r.returncode == 6
    r = run_cli(home, "vault", "list")  # autostart detects the stale socket
    assert r.returncode == 0, r.stderr
    assert "stale" in (home / "logs" / "memoriesd.log").read_text()
    r = run_cli(home, "daemon", "stop")
    assert r.returncode == 0


def test_too_long_home_is_a_clear_error() -> None:
    root = short_tmpdir()
    home = root / ("x" * 120)
    try:
        r = subprocess.run([sys.executable, "-m", "memoriesd.main", "--home", str(home)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "too long for a Unix socket" in r.stderr and r.stderr.count("\n") == 1
        r = run_cli(home, "vault", "list")
        assert r.returncode != 0 and "too long" in r.stderr and "Traceback" not in r.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_canaries_never_reach_disk(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    ids = []
    for i in range(5):
        ids.append(
            daemon.call("memory.add", {"vault": vid, "body": f"BODYCANARY{i} text", "title": f"TITLECANARY{i}", "tags": [f"TAGCANARY{i}"]})["id"]
        )
    daemon.call("memory.update", {"vault": vid, "id": ids[0], "body": "UPDATECANARY", "tags": ["TAGCANARY9"]})
    daemon.call("memory.delete", {"vault": vid, "id": ids[1]})
    daemon.call("memory.add", {"vault": vid, "kind": "credential", "title": "CREDCANARY", "body": "hunter2CANARY"})
    daemon.call("vault.compact", {"vault": vid})
    daemon.call("memory.read", {"vault": vid, "id": ids[2]})
    for path, data in all_file_bytes(daemon.home):
        for canary in (b"CANARY", "CANARY".encode("utf-16-le")):
            assert canary not in data, path


def test_restored_backup_unlocks_with_same_passphrase(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    rid = daemon.call("memory.add", {"vault": vid, "body": "backed up"})["id"]
    daemon.call("vault.lock", {"vault": vid})
    backup = short_tmpdir("bk")
    shutil.copytree(daemon.home / "vaults" / vid, backup / vid)
    daemon.call("vault.delete", {"vault": vid})
    assert daemon.call("vault.list")["vaults"] == []
    shutil.copytree(backup / vid, daemon.home / "vaults" / vid)
    daemon.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    assert daemon.call("memory.read", {"vault": vid, "id": rid})["body"] == "backed up"
    shutil.rmtree(backup)


def test_tampered_vault_is_corrupt_end_to_end_and_daemon_keeps_serving(daemon: Daemon) -> None:
    good = create_vault(daemon, "good", "pw")
    bad = create_vault(daemon, "bad", "pw")
    for i in range(3):
        daemon.call("memory.add", {"vault": bad, "body": f"record {i}"})
    daemon.call("vault.lock", {"vault": bad})
    logf = daemon.home / "vaults" / bad / "log-00000000.bin"
    raw = logf.read_bytes()
    detected = 0
    positions = list(range(0, len(raw), max(1, len(raw) // 30)))
    for pos in positions:
        t = bytearray(raw)
        t[pos] ^= 0x10
        logf.write_bytes(bytes(t))
        msg = daemon.request("vault.unlock", {"vault": bad, "passphrase": "pw"})
        assert msg["error"]["code"] == "vault_corrupt", msg
        assert "bad" in msg["error"]["message"]
        detected += 1
    logf.write_bytes(raw)
    assert detected == len(positions) >= 25
    assert daemon.call("memory.list", {"vault": good})["records"] == []
    daemon.call("vault.unlock", {"vault": bad, "passphrase": "pw"})
    assert len(daemon.call("memory.list", {"vault": bad})["records"]) == 3
    assert daemon.proc is not None and daemon.proc.poll() is None


@pytest.mark.parametrize("damage", ["truncated", "renamed_field", "not_json"])
def test_unreadable_header_is_listed_and_unlock_says_vault_corrupt(daemon: Daemon, damage: str) -> None:
    vid = create_vault(daemon, "notes", "pw")
    daemon.call("vault.lock", {"vault": vid})
    header = daemon.home / "vaults" / vid / "header.json"
    raw = header.read_text()
    header.write_text({"truncated": raw[: len(raw) // 2], "renamed_field": raw.replace('"name"', '"nome"'),
                       "not_json": "\x00\x01garbage"}[damage])
    listed = cli_json(daemon.home, "vault", "list")["vaults"]
    assert [(v["vault_id"], v.get("corrupt")) for v in listed] == [(vid, True)]
    r = run_cli(daemon.home, "vault", "list")
    assert r.returncode == 0 and "corrupt" in r.stdout
    r = run_cli(daemon.home, "vault", "unlock", vid, "--passphrase-stdin", input="pw\n")
    assert r.returncode == 5, r.stderr
    assert r.stderr.startswith("error[vault_corrupt]") and vid in r.stderr and len(r.stderr.strip().splitlines()) == 1
    header.write_text(raw)  # restored from a backup: the vault is whole again
    daemon.call("vault.unlock", {"vault": vid, "passphrase": "pw"})


def test_sigterm_exits_zero_and_removes_socket(home: Path) -> None:
    d = Daemon(home).start()
    create_vault(d)
    assert d.stop() == 0
    assert not d.socket_path.exists() and not (home / "run" / "memoriesd.pid").exists()


def test_peer_connection_is_unix_only(daemon: Daemon) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(daemon.socket_path))
    s.close()
    assert daemon.call("daemon.status")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
