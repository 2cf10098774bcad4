"""The real CLI on a pseudo-terminal that is its controlling terminal, as a person at a shell runs it.

``getpass`` reads from ``/dev/tty`` and flushes typed-ahead input when it turns echo off, so answers
are typed only once the prompt asks for them: :meth:`Terminal.expect` waits for a text on the
terminal or on stderr (where notices and yes/no questions go), :meth:`Terminal.type` answers.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

from .conftest import REPO

#: The longest a prompt may take to appear (a daemon start, an Argon2id derivation on a busy machine).
EXPECT_SECONDS = 60.0


def _controlling_tty() -> None:  # runs in the child between fork and exec
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, home: Path, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            preexec_fn=_controlling_tty,
        )
        os.close(slave)
        self.screen = ""  # what the terminal showed (prompts)
        self.err = ""  # stderr
        self.out = ""  # stdout
        self._read_to = {"screen": 0, "err": 0, "out": 0}

    def _pump(self, timeout: float) -> bool:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        fds = {self.master: "screen", self.proc.stderr.fileno(): "err", self.proc.stdout.fileno(): "out"}
        ready, _, _ = select.select(list(fds), [], [], timeout)
        got = False
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if data:
                got = True
                name = fds[fd]
                setattr(self, name, getattr(self, name) + data.decode("utf-8", "replace"))
        return got

    def expect(self, text: str, where: str = "screen") -> None:
        """Wait until ``text`` appears on the terminal (or ``where="err"``: stderr) after what an earlier
        ``expect`` matched there."""
        deadline = time.monotonic() + EXPECT_SECONDS
        while True:
            at = getattr(self, where).find(text, self._read_to[where])
            if at >= 0:
                self._read_to[where] = at + len(text)
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{text!r} never appeared on {where}: screen={self.screen!r} err={self.err!r}"
                )
            if not self._pump(0.5) and self.proc.poll() is not None:
                raise AssertionError(
                    f"the CLI exited before {text!r}: screen={self.screen!r} err={self.err!r}"
                )

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self) -> int:
        """Read to the end; the exit status."""
        deadline = time.monotonic() + EXPECT_SECONDS
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._pump(0.2)
        while self._pump(0.05):
            pass
        os.close(self.master)
        return self.proc.wait(5)


__all__ = ["Terminal"]
