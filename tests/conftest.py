"""Shared fixtures: short temp homes, real daemon processes, the real CLI in subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def needs_shared(part: str) -> str:
    """Why a test skips (or stops) without the shared models and data sets: what to put beside the clone."""
    return f"needs ../shared/{part} beside the clone (CI has ../shared; see docs/development.md)"

# Cheap KDF parameters keep the suite fast; the defaults stay strong (tested separately).
CHEAP_CONFIG = """
[vault]
kdf_memory_kib = 64
kdf_iterations = 1
kdf_lanes = 1
unlock_delay_step_ms = 20
unlock_delay_max_ms = 100
"""

from memories_cli.client import RESEND_WHEN_ENDED  # noqa: E402
from memoriesd.home import Home  # noqa: E402
from memoriesd.server import protocol  # noqa: E402
from memoriesd.workers.routes import ENDING, route_request  # noqa: E402

from .procs import descendants  # noqa: E402

ROUTE_ATTEMPTS = 6


def short_tmpdir(prefix: str = "mt") -> Path:
    """AF_UNIX paths are limited to 107 bytes: homes live directly under /tmp."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def write_config(home: Path, extra: str = "") -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "config.toml").write_text(CHEAP_CONFIG + "\n" + extra)


class Daemon:
    """A real memoriesd process on a temp home."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.home / "run" / "memoriesd.sock"

    def start(self, timeout: float = 30.0, preexec_fn: Any = None) -> Daemon:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memoriesd.main", "--home", str(self.home)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=str(REPO),
            preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            if self.socket_path.exists():
                try:
                    self.call("daemon.status")
                    return self
                except (OSError, ConnectionError):
                    pass
            time.sleep(0.03)
        raise RuntimeError("daemon did not start")

    def route(self, method: str, params: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
        """The socket a client sends ``method`` to (a vault's process, or the daemon's own), as the
        CLI finds it (``vault.route`` first); or the route's error frame for a locked vault."""
        ask = route_request(method, params or {})
        if ask is None:
            return str(self.socket_path), None
        with self._raw() as s:
            frame = self.request("vault.route", ask, sock=s)
        route = frame.get("result")
        if not isinstance(route, dict):
            return str(self.socket_path), frame
        if route.get("socket"):
            return str(route["socket"]), None
        if isinstance(route.get("error"), dict):
            return str(self.socket_path), {"id": 1, "error": route["error"]}
        return str(self.socket_path), None

    def _raw(self, path: str | None = None) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path or str(self.socket_path))
        return s

    def connect_for(self, method: str, params: dict[str, Any] | None) -> socket.socket:
        """A connection to the process that serves ``method`` with ``params`` (as the CLI routes it)."""
        path, err = self.route(method, params)
        if err is not None:
            raise DaemonError(err["error"]["code"], err["error"]["message"])
        return self._raw(path)

    def connect(self, vault: str | None = None, *, token: str | None = None) -> socket.socket:
        """A connection to the process serving ``vault`` (or the grant ``token``'s vault); the daemon's
        own socket when neither is given."""
        if token is not None:
            parts = token.split("_", 3)
            route = self.call("vault.route", {"vault": parts[1] if len(parts) == 4 else "?", "for_grant": True})
            return self._raw(route.get("socket"))
        if vault is None:
            return self._raw()
        return self.connect_for("vault.status", {"vault": vault})

    def request(self, method: str, params: dict[str, Any] | None = None, sock: socket.socket | None = None) -> dict[str, Any]:
        """One request and its answer frame; without ``sock``, routed as the CLI routes it."""
        if sock is None:  # a vault's process that is ending (just locked) refuses before doing anything: ask again
            msg: dict[str, Any] = {}
            for attempt in range(ROUTE_ATTEMPTS):
                path, err = self.route(method, params)
                if err is not None:
                    return err
                try:
                    s = self._raw(path)
                except (FileNotFoundError, ConnectionRefusedError):
                    if attempt == ROUTE_ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
                    continue
                with s:
                    try:
                        msg = self.request(method, params, sock=s)
                    except ConnectionError:  # the process ended as the request arrived (as the CLI, resend only what is harmless twice)
                        if method not in RESEND_WHEN_ENDED or attempt == ROUTE_ATTEMPTS - 1:
                            raise
                        msg = {"error": {"code": ENDING}}
                if msg.get("error", {}).get("code") != ENDING:
                    return msg
                time.sleep(0.05 * (attempt + 1))
            return msg
        sock.sendall(protocol.encode({"id": 1, "method": method, "params": params or {}}))
        while True:
            msg = protocol.recv_frame(sock)
            if "progress" not in msg:
                return msg

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        msg = self.request(method, params)
        if "error" in msg:
            raise DaemonError(msg["error"]["code"], msg["error"]["message"])
        return msg["result"]

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        return self.proc.returncode

    def kill9(self, everything: bool = True) -> None:
        """SIGKILL the daemon, and (``everything``) first every process below it: a power cut for the
        vault processes that hold the vaults. Without it, the orphaned vault processes lock and exit
        on their own."""
        assert self.proc is not None
        if everything:
            for pid in reversed(descendants(self.proc.pid)[1:]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()

    def log_text(self) -> str:
        p = self.home / "logs" / "memoriesd.log"
        return p.read_text("utf-8", "replace") if p.exists() else ""


class DaemonError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def run_cli(home: Path, *args: str, input: str | bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real `memories` CLI in a subprocess."""
    data = input.decode() if isinstance(input, bytes) else input
    return subprocess.run(
        [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
        input=data if data is not None else "",
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        cwd=str(REPO),
        timeout=timeout,
    )


def cli_ok(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, which must succeed (its stderr is the failure message)."""
    r = run_cli(home, *args, env=env)
    assert r.returncode == 0, r.stderr
    return r


def cli_json(home: Path, *args: str, input: str | None = None) -> Any:
    r = run_cli(home, "--json", *args, input=input)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def home() -> Iterator[Path]:
    d = short_tmpdir()
    h = d / "h"
    write_config(h)
    yield h
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(home: Path) -> Iterator[Daemon]:
    d = Daemon(home).start()
    yield d
    d.stop()


@contextlib.contextmanager
def running_daemon(config: str = "", env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon on a fresh short home with this config.toml text; stopped and removed after."""
    root = short_tmpdir()
    home = root / "h"
    write_config(home, config)
    d = Daemon(home, env=env).start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def create_vault(d: Daemon, name: str = "personal", passphrase: str = "correct horse") -> str:
    return str(d.call("vault.create", {"name": name, "passphrase": passphrase})["vault_id"])


def all_file_bytes(root: Path) -> list[tuple[Path, bytes]]:
    out = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out.append((p, p.read_bytes()))
    return out


__all__ = ["Daemon", "DaemonError", "Home", "run_cli", "cli_json", "create_vault", "short_tmpdir", "write_config", "SHARED", "REPO", "needs_shared"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Keep each phase's report on the test item, so a fixture can tell that its test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def print_log_if_failed(request: pytest.FixtureRequest, d: Daemon) -> None:
    """On a failed test, the daemon's log (it never holds note text, titles or secrets) goes to the
    captured output pytest shows with the failure: what the vault processes did is then on record."""
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print("---- memoriesd.log (last 200 lines) ----")
        print("\n".join(d.log_text().splitlines()[-200:]))
