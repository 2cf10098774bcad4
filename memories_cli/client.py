"""Talk to memoriesd: connect (starting it when allowed), send one request, read the answer.

Timeouts: connecting gives up after ``CONNECT_TIMEOUT`` seconds, and a request after
``$MEMORIES_CLIENT_TIMEOUT`` seconds (default 30; 0 = wait forever) in which the daemon sent nothing.
A running request is never silent that long: the daemon sends a keep-alive progress frame
``{"id": N, "progress": {"keepalive": true}}`` every ``[daemon] keepalive_seconds`` (10), which is
never passed on to a progress callback. Either timeout is ``daemon_unreachable``.
"""

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
CONNECT_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0
TIMEOUT_ENV = "MEMORIES_CLIENT_TIMEOUT"


def client_timeout() -> float | None:
    """Seconds of silence from the daemon after which a request gives up (None = never)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_TIMEOUT
    if value != value or value < 0:  # NaN or negative: the default
        return DEFAULT_TIMEOUT
    return None if value == 0 else value


def is_keepalive(progress: Any) -> bool:
    return isinstance(progress, dict) and progress.get("keepalive") is True


def _connect(home: Home) -> socket.socket:
    home.check_socket_path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(str(home.socket_path))
        sock.settimeout(client_timeout())
    except OSError:
        sock.close()
        raise
    return sock


def _silent(home: Home, seconds: float | None, method: str) -> DaemonUnreachable:
    return DaemonUnreachable(
        f"memoriesd sent nothing for {seconds:g} s during {method}: it is stopped or overloaded; see {home.log_path}, "
        f"and if it stays stuck, end the process (pid in {home.pid_path}) and run the command again"
    )


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
    except TimeoutError:
        return True  # something listens but does not accept: the request will say so
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
    """``on_notice`` receives each of the daemon's reply notices (the frame's ``notices``, e.g. "config.toml
    changed: restart pending"), before the result is returned or its error raised."""

    def __init__(
        self, home: Home, *, autostart: bool = True, on_notice: Callable[[str], None] | None = None
    ) -> None:
        self.home = home
        self.autostart = autostart
        self.on_notice = on_notice

    def _open(self) -> socket.socket:
        try:
            return _connect(self.home)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        except TimeoutError as exc:
            raise DaemonUnreachable(
                f"memoriesd at {self.home.socket_path} did not accept the connection within {CONNECT_TIMEOUT:g} s: "
                f"it is stopped or overloaded; see {self.home.log_path}"
            ) from exc
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
        timeout = sock.gettimeout()
        try:
            rid = next(_ids)
            try:
                sock.sendall(protocol.encode({"id": rid, "method": method, "params": params or {}}))
            except TimeoutError as exc:
                raise _silent(self.home, timeout, method) from exc
            except OSError:
                pass  # e.g. refused as busy and closed: the daemon's error frame is still to be read
            while True:
                try:
                    msg = protocol.recv_frame(sock)
                except TimeoutError as exc:
                    raise _silent(self.home, timeout, method) from exc
                except (ConnectionError, OSError) as exc:
                    raise DaemonUnreachable(
                        f"memoriesd closed the connection during {method}: see {self.home.log_path}"
                    ) from exc
                if "progress" in msg:
                    if progress is not None and not is_keepalive(msg["progress"]):
                        progress(msg["progress"])
                    continue
                if self.on_notice is not None and isinstance(msg.get("notices"), list):
                    for text in msg["notices"]:
                        self.on_notice(str(text))
                if "error" in msg:
                    err = msg["error"] or {}
                    raise MemoriesError(str(err.get("message", "unknown error")), code=str(err.get("code", "internal")))
                return msg.get("result")
        finally:
            sock.close()
