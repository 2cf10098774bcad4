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
import tempfile
import time
from pathlib import Path
from typing import Any

from memoriesd.server import protocol
from memoriesd.workers.process import child_command
from memoriesd.workers.routes import ENDING, route_request
from tests.procs import descendants

REPO = Path(__file__).resolve().parents[2]
#: Cheap Argon2id parameters for the vaults where the KDF is not what is tested.
CHEAP = """
[vault]
kdf_memory_kib = 64
kdf_iterations = 1
kdf_lanes = 1
unlock_delay_step_ms = 5
unlock_delay_max_ms = 20
[index]
background = false
"""
#: The defaults (Argon2id at its real cost), with the same delays.
STRONG = """
[vault]
unlock_delay_step_ms = 5
unlock_delay_max_ms = 20
[index]
background = false
"""
#: Requests sent again when the vault's process ended under them (as the CLI: harmless twice).
RESEND = frozenset({"vault.unlock", "vault.status"})
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
            child_command("memoriesd.main", "--home", str(self.home)),
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

    def processes(self) -> list[int]:
        """The daemon and every live process below it (vault processes, the spare, the model), parents first."""
        return descendants(self.proc.pid) if self.proc is not None else []

    def sample_rss(self) -> int:
        """The peak resident set so far (VmHWM, KiB) summed over the daemon's processes; kept as the engine's peak."""
        total = 0
        for pid in self.processes():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
            except (OSError, ValueError):
                pass
        self.peak_rss_kib = max(self.peak_rss_kib, total)
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
        for pid in reversed(self.processes()[1:]):  # a power cut: the vault processes die with it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def restart(self, *, hard: bool = False) -> None:
        if hard:
            self.kill9()
        else:
            self.stop()
        self.start()

    def _raw(self, path: str | Path | None = None) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(str(path or self.socket_path))
        except OSError:
            s.close()
            raise
        return s

    def route(self, method: str, params: dict[str, Any] | None) -> tuple[str | None, Reply | None]:
        """The socket of the process that serves ``method`` (None: the daemon's own), as the CLI asks
        (``vault.route``); or the route's error for a locked vault."""
        ask = route_request(method, params or {})
        if ask is None:
            return None, None
        with self._raw() as s:
            s.sendall(protocol.encode({"id": 1, "method": "vault.route", "params": ask}))
            r = read_until_reply(s)
        route = r.result
        if not isinstance(route, dict):
            return None, r
        if route.get("socket"):
            return str(route["socket"]), None
        if isinstance(route.get("error"), dict):
            return None, Reply({"id": 1, "error": route["error"]})
        return None, None

    def connect(self, vault: str | None = None) -> socket.socket:
        """A connection to the process serving ``vault`` (the daemon's own socket when None or locked)."""
        path = self.route("vault.status", {"vault": vault})[0] if vault else None
        return self._raw(path)

    def request(self, method: str, params: dict[str, Any] | None = None, sock: socket.socket | None = None) -> Reply:
        if sock is not None:
            sock.sendall(protocol.encode({"id": 1, "method": method, "params": params or {}}))
            return read_until_reply(sock)
        r = Reply()
        for attempt in range(6):  # a vault's process that is ending (just locked) refused: ask again
            path, err = self.route(method, params)
            if err is not None:
                return err
            try:
                s = self._raw(path)
            except (FileNotFoundError, ConnectionRefusedError):  # it ended since the route: nothing was sent
                if attempt == 5:
                    raise
                r = Reply({"error": {"code": ENDING}})
            else:
                with s:
                    try:
                        r = self.request(method, params, sock=s)
                    except (ConnectionResetError, BrokenPipeError, ConnectionError):
                        # The vault's process ended under the request (its vault locked), as the CLI reports it.
                        r = Reply({"id": 1, "error": {"code": ENDING if method in RESEND else "vault_locked",
                                                      "message": "the vault's process ended during the request"}})
            if r.code != ENDING:
                return r
            time.sleep(0.05 * (attempt + 1))
        return r

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
