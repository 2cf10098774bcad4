"""The Memories home: ``--home``, else ``$MEMORIES_HOME``, else ``~/.memories``.

Layout (every directory 0700)::

    HOME/config.toml      optional settings
    HOME/vaults/<id>/     one directory per vault
    HOME/run/             socket, pid file, lock
    HOME/models/          installed model files
    HOME/logs/            daemon log (never note text, titles, passphrases or keys)
    HOME/cache/           private scratch (jieba's dictionary cache)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import HomeError

SOCKET_NAME = "memoriesd.sock"
AF_UNIX_MAX = 107


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    @property
    def vaults(self) -> Path:
        return self.root / "vaults"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def socket_path(self) -> Path:
        return self.run / SOCKET_NAME

    @property
    def pid_path(self) -> Path:
        return self.run / "memoriesd.pid"

    @property
    def lock_path(self) -> Path:
        return self.run / "memoriesd.lock"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def log_path(self) -> Path:
        return self.logs / "memoriesd.log"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def ensure(self) -> None:
        """Create the home and its directories with 0700, tightening existing ones."""
        old = os.umask(0o077)
        try:
            for d in (self.root, self.vaults, self.run, self.models, self.logs, self.cache):
                try:
                    d.mkdir(mode=0o700, parents=True, exist_ok=True)
                    if d.stat().st_uid == os.getuid():
                        os.chmod(d, 0o700)
                except OSError as exc:
                    raise HomeError(
                        f"cannot create the Memories home directory {d} ({exc.strerror}): "
                        "choose another with --home or MEMORIES_HOME"
                    ) from exc
        finally:
            os.umask(old)

    def check_socket_path(self) -> None:
        if len(os.fsencode(str(self.socket_path))) > AF_UNIX_MAX:
            raise HomeError(
                f"the Memories home path is too long for a Unix socket ({len(str(self.socket_path))} bytes, "
                f"at most {AF_UNIX_MAX}): choose a shorter --home or MEMORIES_HOME"
            )


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Home:
    if explicit:
        root = Path(explicit)
    elif os.environ.get("MEMORIES_HOME"):
        root = Path(os.environ["MEMORIES_HOME"])
    else:
        root = Path.home() / ".memories"
    return Home(root.expanduser().absolute())
