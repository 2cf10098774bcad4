"""Talk to memoriesd: connect (starting it when allowed), send one request, read the answer.

Timeouts: connecting gives up after ``CONNECT_TIMEOUT`` seconds, and a request after
``$MEMORIES_CLIENT_TIMEOUT`` seconds (default 30; 0 = wait forever) in which the daemon sent nothing.
A running request is never silent that long: the daemon sends a keep-alive progress frame
``{"id": N, "progress": {"keepalive": true}}`` every ``[daemon] keepalive_seconds`` (10), which is
never passed on to a progress callback. Either timeout is ``daemon_unreachable``.

Vault processes: a request for a vault is sent to the process serving that vault, which the daemon
names first (``vault.route``: a socket path, no content), so the main daemon never reads a note, a
query or a passphrase. For a locked vault the route's error is raised without sending the request.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memoriesd.errors import DaemonUnreachable, MemoriesError
from memoriesd.home import Home
from memoriesd.server import protocol
from memoriesd.workers.routes import ENDING, RESEND_WHEN_ENDED, route_request

_ids = itertools.count(1)
START_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0
TIMEOUT_ENV = "MEMORIES_CLIENT_TIMEOUT"
#: Routes asked for one request while a vault's process is ending (its vault just locked).
ROUTE_ATTEMPTS = 6


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


def _connect(home: Home, path: str | None = None) -> socket.socket:
    """A connection to the daemon's socket, or to ``path`` (a vault's process)."""
    home.check_socket_path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(path or str(home.socket_path))
        sock.settimeout(client_timeout())
    except OSError:
        sock.close()
        raise
    return sock


def _silent(home: Home, seconds: float | None, method: str, route: dict[str, Any] | None = None) -> DaemonUnreachable:
    if route is not None:  # a vault's own process: frozen or overloaded; the rest of the daemon is not
        name = route.get("name") or route.get("vault_id") or "?"
        return DaemonUnreachable(
            f"the process serving vault {name} sent nothing for {seconds:g} s during {method}: it is stopped or "
            f"overloaded; `memories vault lock {name}` ends it (what it acknowledged is kept), then unlock it again"
        )
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
    from memoriesd.workers.process import child_command  # it imports logging: ~2 ms of every command

    home.ensure()
    home.check_socket_path()
    err_path = home.run / "start.err"
    with open(err_path, "wb") as err:
        os.chmod(err_path, 0o600)
        proc = subprocess.Popen(
            child_command("memoriesd.main", "--home", str(home.root)),
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

    def route(self, ask: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the daemon where a vault is served (``vault.route``): the route, or None for "the daemon
        itself" (a locked vault it can answer for). A locked vault's error is raised here, so its
        request is never sent."""
        try:
            route = self._exchange(self._open(), "vault.route", ask, None, notices=False)
        except MemoriesError as exc:
            if exc.code == "unknown_method":  # a daemon of an older version: it serves every vault itself
                return None
            raise
        if not isinstance(route, dict) or not route.get("socket"):
            err = route.get("error") if isinstance(route, dict) else None
            if isinstance(err, dict):
                raise MemoriesError(str(err.get("message", "unknown error")), code=str(err.get("code", "internal")))
            return None
        return route

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        params = params or {}
        ask = route_request(method, params)
        for attempt in range(ROUTE_ATTEMPTS):
            route = self.route(ask) if ask is not None else None
            if route is None:
                return self._exchange(self._open(), method, params, progress)
            last = attempt == ROUTE_ATTEMPTS - 1
            try:
                sock = _connect(self.home, str(route["socket"]))
            except OSError:
                if last:
                    raise _ended(self.home, route, method) from None
                time.sleep(0.05 * (attempt + 1))  # the process ended since (locked): ask again
                continue
            try:
                return self._exchange(sock, method, params, progress, route=route)
            except MemoriesError as exc:
                ended = getattr(exc, "process_ended", False) and method in RESEND_WHEN_ENDED
                if (exc.code != ENDING and not ended) or last:
                    raise
                time.sleep(0.05 * (attempt + 1))  # it refused before doing anything: its vault just locked
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(
        self,
        sock: socket.socket,
        method: str,
        params: dict[str, Any],
        progress: Callable[[dict[str, Any]], None] | None,
        *,
        notices: bool = True,
        route: dict[str, Any] | None = None,
    ) -> Any:
        timeout = sock.gettimeout()
        try:
            rid = next(_ids)
            try:
                sock.sendall(protocol.encode({"id": rid, "method": method, "params": params}))
            except TimeoutError as exc:
                raise _silent(self.home, timeout, method, route) from exc
            except OSError:
                pass  # e.g. refused as busy and closed: the daemon's error frame is still to be read
            while True:
                try:
                    msg = protocol.recv_frame(sock)
                except TimeoutError as exc:
                    raise _silent(self.home, timeout, method, route) from exc
                except (ConnectionError, OSError) as exc:
                    if route is not None:
                        raise _ended(self.home, route, method) from exc
                    raise DaemonUnreachable(
                        f"memoriesd closed the connection during {method}: see {self.home.log_path}"
                    ) from exc
                if "progress" in msg:
                    if progress is not None and not is_keepalive(msg["progress"]):
                        progress(msg["progress"])
                    continue
                if notices and self.on_notice is not None and isinstance(msg.get("notices"), list):
                    for text in msg["notices"]:
                        self.on_notice(str(text))
                if "error" in msg:
                    err = msg["error"] or {}
                    raise MemoriesError(str(err.get("message", "unknown error")), code=str(err.get("code", "internal")))
                return msg.get("result")
        finally:
            sock.close()


def _ended(home: Home, route: dict[str, Any], method: str) -> MemoriesError:
    """A vault's process went away under a request: it was locked, or it failed."""
    name = route.get("name") or route.get("vault_id") or "?"
    err = MemoriesError(
        f"the process serving vault {name} ended during {method} (the vault was locked, or the process failed: see "
        f"{home.log_path}): unlock the vault and run the command again; what was acknowledged before is kept",
        code="vault_locked",
    )
    err.process_ended = True  # type: ignore[attr-defined]
    return err
