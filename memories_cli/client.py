"""Talk to memoriesd: connect (starting it when allowed), send one request, read the answer."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memoriesd.errors import DaemonUnreachable, MemoriesError
from memoriesd.home import Home
from memoriesd.server import protocol

_ids = itertools.count(1)
START_TIMEOUT = 30.0


def _connect(home: Home) -> socket.socket:
    home.check_socket_path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(home.socket_path))
    except OSError:
        sock.close()
        raise
    return sock


def _autostart_enabled(home: Home) -> bool:
    """Read only `[daemon] autostart` (cheaply) from config.toml; full validation is the daemon's job."""
    path = home.config_path
    if not path.exists():
        return True
    try:
        import tomllib

        data = tomllib.loads(path.read_text("utf-8"))
        value = data.get("daemon", {}).get("autostart", True)
        return value is not False
    except Exception:
        return True  # the daemon will report the config error itself


def daemon_alive(home: Home) -> bool:
    try:
        sock = _connect(home)
    except OSError:
        return False
    sock.close()
    return True


def start_daemon(home: Home, timeout: float = START_TIMEOUT) -> int:
    """Start memoriesd in the background for ``home``; wait until its socket answers. Returns its pid."""
    home.ensure()
    home.check_socket_path()
    err_path = home.run / "start.err"
    with open(err_path, "wb") as err:
        os.chmod(err_path, 0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "memoriesd.server.daemon", "--home", str(home.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_alive(home):
            return proc.pid
        code = proc.poll()
        if code is not None:
            lines = [ln for ln in Path(err_path).read_text("utf-8", "replace").splitlines() if ln.strip()]
            detail = lines[-1] if lines else f"it exited with status {code}"
            detail = detail.removeprefix("memoriesd: ")
            if detail.startswith("error["):
                code_end = detail.index("]")
                raise MemoriesError(detail[code_end + 2 :].strip(), code=detail[6:code_end])
            raise DaemonUnreachable(f"memoriesd did not start ({detail}): see {home.log_path}")
        time.sleep(0.05)
    raise DaemonUnreachable(f"memoriesd did not answer within {timeout:.0f} s: see {home.log_path}")


class Client:
    def __init__(self, home: Home, *, autostart: bool = True) -> None:
        self.home = home
        self.autostart = autostart

    def _open(self) -> socket.socket:
        try:
            return _connect(self.home)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        except OSError as exc:
            raise DaemonUnreachable(f"cannot reach memoriesd at {self.home.socket_path} ({exc.strerror})") from exc
        if not (self.autostart and _autostart_enabled(self.home)):
            raise DaemonUnreachable(
                f"memoriesd is not running for {self.home.root}: start it with `memories daemon start`"
            )
        start_daemon(self.home)
        try:
            return _connect(self.home)
        except OSError as exc:
            raise DaemonUnreachable(f"cannot reach memoriesd at {self.home.socket_path}") from exc

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        sock = self._open()
        try:
            rid = next(_ids)
            sock.sendall(protocol.encode({"id": rid, "method": method, "params": params or {}}))
            while True:
                try:
                    msg = protocol.recv_frame(sock)
                except (ConnectionError, OSError) as exc:
                    raise DaemonUnreachable(
                        f"memoriesd closed the connection during {method}: see {self.home.log_path}"
                    ) from exc
                if "progress" in msg:
                    if progress is not None:
                        progress(msg["progress"])
                    continue
                if "error" in msg:
                    err = msg["error"] or {}
                    raise MemoriesError(str(err.get("message", "unknown error")), code=str(err.get("code", "internal")))
                return msg.get("result")
        finally:
            sock.close()
