"""A real ``memoriesd`` process on a temp home, spoken to over its real socket (stateful and fuzz engines).

Unlike :mod:`.scenarios` (the daemon's dispatch in this process), these engines need the whole
daemon: its socket, frame reader, thread pool and process, so that a crash is a dead process and a
hang is a socket that stays silent.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memoriesd.server import protocol

REPO = Path(__file__).resolve().parents[2]
#: Cheap Argon2id parameters for the vaults where the KDF is not what is tested.
CHEAP = """
[vault]
kdf_memory_kib = 64
kdf_iterations = 1
kdf_lanes = 1
unlock_delay_step_ms = 5
unlock_delay_max_ms = 20
[rag]
background_index = false
"""
#: The defaults (Argon2id at its real cost), with the same delays.
STRONG = """
[vault]
unlock_delay_step_ms = 5
unlock_delay_max_ms = 20
[rag]
background_index = false
"""
#: Seconds of silence (keep-alive frames aside) after which a request counts as hung.
HANG_SECONDS = 60.0


class Hung(Exception):
    """The daemon sent nothing for :data:`HANG_SECONDS`."""


class Reply(dict):  # type: ignore[type-arg]
    """A response frame; ``code`` is its error code (None for a result)."""

    @property
    def code(self) -> str | None:
        err = self.get("error")
        return str(err.get("code")) if isinstance(err, dict) else None

    @property
    def result(self) -> Any:
        return self.get("result")


def new_home(config: str = CHEAP) -> Path:
    root = Path(tempfile.mkdtemp(prefix="mr", dir="/tmp"))  # AF_UNIX paths are short
    home = root / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(config)
    return home


def read_until_reply(sock: socket.socket, timeout: float = HANG_SECONDS) -> Reply:
    """The next non-progress frame (keep-alive frames restart the clock)."""
    sock.settimeout(timeout)
    while True:
        try:
            msg = protocol.recv_frame(sock)
        except TimeoutError as exc:
            raise Hung(f"no frame for {timeout:g} s") from exc
        if "progress" not in msg:
            return Reply(msg)


class LiveDaemon:
    """``start``/``stop``/``kill9``/``restart``; ``request`` on a fresh or given connection."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_kib = 0
        self.starts = 0
        self.crashes = 0  # exits the engine did not ask for

    @property
    def socket_path(self) -> Path:
        return self.home / "run" / "memoriesd.sock"

    def set_config(self, text: str) -> None:
        (self.home / "config.toml").write_text(text)

    def start(self, timeout: float = 60.0) -> LiveDaemon:
        env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
        env.pop("MEMORIES_GRANT", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memoriesd.server.daemon", "--home", str(self.home)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=str(REPO),
        )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memoriesd exited with status {self.proc.returncode} while starting")
            if self.socket_path.exists():
                try:
                    if self.request("daemon.status").result:
                        return self
                except (OSError, ConnectionError, Hung):
                    pass
            time.sleep(0.03)
        raise RuntimeError("memoriesd did not start")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sample_rss(self) -> int:
        """The daemon's peak resident set so far (VmHWM, KiB); kept as the engine's peak."""
        if self.proc is None:
            return self.peak_rss_kib
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        return self.peak_rss_kib

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.sample_rss()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        if code != 0:
            self.crashes += 1
        self.proc = None
        return code

    def kill9(self) -> None:
        if self.proc is None:
            return
        self.sample_rss()
        if self.proc.poll() is not None:
            self.crashes += 1  # it was already gone
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def restart(self, *, hard: bool = False) -> None:
        if hard:
            self.kill9()
        else:
            self.stop()
        self.start()

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(str(self.socket_path))
        return s

    def request(self, method: str, params: dict[str, Any] | None = None, sock: socket.socket | None = None) -> Reply:
        own = sock is None
        s = sock or self.connect()
        try:
            s.sendall(protocol.encode({"id": 1, "method": method, "params": params or {}}))
            return read_until_reply(s)
        finally:
            if own:
                s.close()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        r = self.request(method, params)
        if r.code is not None:
            raise RuntimeError(f"{method}: {r['error']}")
        return r.result

    def log_text(self) -> str:
        p = self.home / "logs" / "memoriesd.log"
        return p.read_text("utf-8", "replace") if p.exists() else ""

    def remove(self) -> None:
        if self.proc is not None:
            self.stop()
        shutil.rmtree(self.home.parent, ignore_errors=True)


__all__ = ["CHEAP", "STRONG", "HANG_SECONDS", "Hung", "LiveDaemon", "Reply", "new_home", "read_until_reply"]
