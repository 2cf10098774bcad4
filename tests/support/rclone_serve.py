"""A real ``rclone serve webdav`` or ``rclone serve sftp`` on 127.0.0.1, and an rclone config naming it.

The sync tests (and the engine's convergence tests) reach it as ``rclone:dav:PATH`` / ``rclone:sftp:PATH``
through the real ``rclone`` program: the config file is written here, into the test's directory,
never into the user's ``~/.config/rclone``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: One line for a skip when rclone is absent (scripts/test.sh installs it where it can).
RCLONE_MISSING = "rclone is not installed (apt-get install rclone): the rclone transport tests skip"

#: Remote names of the config file :func:`start` writes, by kind.
REMOTES = {"webdav": "dav", "sftp": "sftp"}


def rclone_program() -> str | None:
    return shutil.which("rclone")


def free_port() -> int:
    """A TCP port nobody listens on now (the server may still lose the race: :func:`start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class RcloneServer:
    """A running ``rclone serve KIND`` of ``root``; ``config`` is an rclone config with its remote."""

    kind: str
    root: Path
    config: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def remote(self) -> str:
        return REMOTES[self.kind]

    def target(self, path: str) -> str:
        """The sync target text of ``path`` on this server: ``rclone:dav:path``."""
        return f"rclone:{self.remote}:{path}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def _obscure(program: str, secret: str) -> str:
    """rclone's config holds passwords "obscured" (its own reversible encoding): ask rclone for it."""
    out = subprocess.run([program, "obscure", secret], capture_output=True, check=True, timeout=60)
    return out.stdout.decode().strip()


def _config_text(kind: str, port: int, user: str, obscured: str) -> str:
    name = REMOTES[kind]
    if kind == "webdav":
        return f"[{name}]\ntype = webdav\nurl = http://127.0.0.1:{port}/\nvendor = other\nuser = {user}\npass = {obscured}\n"
    # No shell on the server side: rclone must not try md5sum/sha1sum commands over SSH.
    return (
        f"[{name}]\ntype = sftp\nhost = 127.0.0.1\nport = {port}\nuser = {user}\npass = {obscured}\n"
        "shell_type = none\nmd5sum_command = none\nsha1sum_command = none\n"
    )


def start(kind: str, root: Path, workdir: Path, timeout: float = 120.0) -> RcloneServer:
    """Serve ``root`` over ``kind`` ("webdav" or "sftp") with a random user and password on a free
    port; return once the port accepts connections (deadline ``timeout``)."""
    program = rclone_program()
    assert program, RCLONE_MISSING
    root.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    user, password = "u" + secrets.token_hex(4), secrets.token_hex(16)
    obscured = _obscure(program, password)
    # The server's own state (sftp host keys) under workdir, not the user's cache.
    env = dict(os.environ, XDG_CACHE_HOME=str(workdir / "cache"), XDG_CONFIG_HOME=str(workdir / "xdg"))
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        attempt += 1
        port = free_port()
        log = workdir / f"serve-{kind}-{attempt}.log"
        cmd = [program, "serve", kind, "--addr", f"127.0.0.1:{port}", "--user", user, "--pass", password]
        cmd += ["--config", str(workdir / "serve.conf"), "--log-file", str(log), str(root)]
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        while proc.poll() is None and not port_open(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None and port_open(port):
            break
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"rclone serve {kind} did not listen within {timeout:g} s (log: {log})")
        if time.monotonic() >= deadline or attempt >= 5:  # exited: the port was taken meanwhile, or worse
            raise RuntimeError(
                f"rclone serve {kind} ended at start: {log.read_text(errors='replace')[-500:]}"
            )
    config = workdir / f"rclone-{kind}.conf"
    config.write_text(_config_text(kind, port, user, obscured))
    config.chmod(0o600)
    return RcloneServer(kind, root, config, port, proc, log)
