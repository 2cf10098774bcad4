"""A target on one of the user's rclone remotes (S3, B2, WebDAV, SFTP, ...), through the ``rclone`` program.

Each operation is one rclone command, run with an argument list (never a shell), ``--`` before the
remote path, no terminal and a deadline: ``lsjson`` lists, ``cat`` reads, ``rcat`` writes from stdin,
``deletefile`` deletes, ``mkdir`` creates the root. Credentials live in rclone's own config; this
module never reads it and never repeats what rclone printed beyond one summarised line (a URL's
user-info is dropped from it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from ..errors import UsageError
from .base import Entry, TargetError, check_name

_INSTALL = "install it (https://rclone.org/install/) or use a folder target"

# A remote's name as `rclone config` allows it: letters, digits, _ - + . @ and inner spaces; no - first.
_REMOTE = re.compile(r"[\w.@+](?:[\w.@+ -]*[\w.@+-])?")

# rclone exit codes (https://rclone.org/docs/#exit-code): 3 = directory not found, 4 = file not found.
_NOT_FOUND = (3, 4)

_STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\s+(?:(?:ERROR|NOTICE|CRITICAL|INFO|DEBUG)\s*:\s*)?")
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)


def summarize(stderr: bytes, limit: int = 240) -> str:
    """rclone's stderr as one line: its last message (rclone ends with the reason it failed)."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        return "no message"
    line = _USERINFO.sub(r"\1", _STAMP.sub("", lines[-1]))
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class RcloneTransport:
    """``rclone:REMOTE:PATH``: the folder PATH (may be empty: the remote's root) of a remote named
    REMOTE in the user's rclone config."""

    scheme = "rclone"

    def __init__(
        self,
        remote_path: str,
        program: str = "rclone",
        config_file: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        remote, sep, path = remote_path.partition(":")
        how = "write rclone:REMOTE:PATH with REMOTE a remote of `rclone config` (`rclone listremotes` lists them)"
        if sep and not remote:  # not repeated: such a string holds the backend's credentials
            raise UsageError(f"the sync target is an on-the-fly rclone remote (rclone::backend,...): {how}")
        if not sep or not _REMOTE.fullmatch(remote):
            raise UsageError(f"the sync target rclone:{remote_path} names no remote: {how}")
        if any(ord(c) < 32 or c == "\x7f" for c in path):
            raise UsageError(
                f"the sync target rclone:{remote_path!r} has a control character in its path: remove it"
            )
        self.remote = remote
        self.path = path.rstrip("/") if path.strip("/") else path
        self.program = os.path.expanduser(program)
        self.config_file = config_file
        self.timeout = timeout

    def describe(self) -> str:
        return f"rclone:{self.remote}:{self.path}"

    # -- running rclone -------------------------------------------------------------------------

    def _root(self) -> str:
        return f"{self.remote}:{self.path}"

    def _file(self, name: str) -> str:
        check_name(name)
        if not self.path or self.path.endswith("/"):
            return f"{self._root()}{name}"
        return f"{self._root()}/{name}"

    def _run(
        self, action: str, args: list[str], data: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one rclone command (``args``: the command, its flags, then the remote path last); a
        missing program or a deadline is a :class:`TargetError`, a non-zero exit is the caller's."""
        cmd = [self.program, *args[:-1], "--ask-password=false", "--log-level", "ERROR", "--retries", "1"]
        cmd += ["--low-level-retries", "3", "--contimeout", "15s"]
        if self.config_file:
            cmd += ["--config", self.config_file]
        cmd += ["--", args[-1]]  # the path can never be read as a flag
        try:
            return subprocess.run(
                cmd,
                input=data if data is not None else None,
                stdin=None if data is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            if os.sep in self.program:
                raise TargetError(
                    f"the rclone program {self.program} does not exist: {_INSTALL}, or fix [sync] rclone_program"
                ) from None
            raise TargetError(f"rclone is not installed: {_INSTALL}") from None
        except PermissionError:
            raise TargetError(
                f"the rclone program {self.program} cannot be run (permission denied): fix [sync] rclone_program"
            ) from None
        except subprocess.TimeoutExpired:
            raise TargetError(
                f"rclone did not finish {action} {self.describe()} within {self.timeout:g} s: check the network and "
                "the remote, or raise [sync] rclone_timeout_seconds"
            ) from None
        except OSError as exc:
            raise TargetError(f"rclone could not be started ({exc.strerror}): {_INSTALL}") from None

    def _fail(self, action: str, proc: subprocess.CompletedProcess[bytes]) -> TargetError:
        why = summarize(proc.stderr)
        if "didn't find section in config file" in why:
            where = self.config_file or "rclone's config"
            return TargetError(
                f"the rclone remote {self.remote!r} is not in {where}: add it with `rclone config` "
                "(or point [sync] rclone_config at the file that has it)"
            )
        return TargetError(
            f"rclone could not {action} {self.describe()}: {why}: check the remote is reachable (`rclone lsd {self.remote}:`)"
        )

    # -- the protocol ---------------------------------------------------------------------------

    def list(self) -> list[Entry]:
        proc = self._run(
            "listing",
            ["lsjson", "--files-only", "--no-mimetype", "--no-modtime", "--max-depth", "1", self._root()],
        )
        if proc.returncode == 3:
            raise TargetError(
                f"the rclone target {self.describe()} is missing (directory not found): check the path, "
                "or add the target again (`memories sync add` creates it)"
            )
        if proc.returncode != 0:
            raise self._fail("list", proc)
        try:
            items = json.loads(proc.stdout or b"[]")
        except ValueError:
            raise TargetError(
                f"rclone gave a listing of {self.describe()} that is not JSON: update rclone"
            ) from None
        out: list[Entry] = []
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict) or item.get("IsDir"):
                continue
            name, size = item.get("Name"), item.get("Size")
            if isinstance(name, str) and "/" not in name and isinstance(size, int):
                out.append(Entry(name, size))
        out.sort(key=lambda e: e.name)
        return out

    def read(self, name: str) -> bytes | None:
        proc = self._run("reading", ["cat", self._file(name)])
        if proc.returncode in _NOT_FOUND:
            return None
        if proc.returncode != 0:
            raise self._fail("read from", proc)
        return proc.stdout

    def write(self, name: str, data: bytes) -> None:
        # The size told up front: one plain upload of a known length (a single PUT on object stores up to
        # their multipart cutoff, so no reader sees a partial object), not rclone's chunked streaming.
        proc = self._run("writing", ["rcat", "--size", str(len(data)), self._file(name)], data=data)
        if proc.returncode != 0:
            raise self._fail("write to", proc)

    def delete(self, name: str) -> None:
        proc = self._run("deleting", ["deletefile", self._file(name)])
        if proc.returncode in _NOT_FOUND:
            return
        if proc.returncode != 0:
            why = summarize(proc.stderr)
            if why.endswith("is a directory or doesn't exist") or "not found" in why:
                return
            raise self._fail("delete from", proc)

    def ensure(self) -> None:
        proc = self._run("creating", ["mkdir", self._root()])
        if proc.returncode != 0:
            raise self._fail("create", proc)
