"""AI clients' own MCP configuration files: where each keeps its servers, and editing them safely.

Each client's documented format and user-level location:

- Claude Code: ``~/.claude.json``, top-level ``mcpServers`` (what ``claude mcp add --scope user``
  writes), each entry ``{"type": "stdio", "command", "args", "env"}``; a project's ``.mcp.json`` has
  the same shape (``--config``).
- Claude Desktop: ``claude_desktop_config.json`` in ``~/Library/Application Support/Claude/`` (macOS)
  or ``$XDG_CONFIG_HOME/Claude/`` (``~/.config/Claude/``, Linux), ``mcpServers`` with
  ``{"command", "args", "env"}``.
- Cursor: ``~/.cursor/mcp.json``, ``mcpServers`` with ``{"command", "args", "env"}``.
- Codex: ``$CODEX_HOME/config.toml`` (``~/.codex/config.toml``), a ``[mcp_servers.NAME]`` table with
  ``command``, ``args`` and ``env``.

Editing never touches another server or key: the file is parsed (JSON, or TOML with ``tomlkit``,
which keeps comments and layout), one entry is added or removed, a copy of the old file is kept as
``FILE.bak.YYYYmmdd-HHMMSS`` (0600: it may hold other servers' secrets), and the new text replaces
the file atomically (same directory, fsync, rename), keeping its mode. A file that does not parse is
refused in one line and left as it is.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memoriesd.errors import MemoriesError

from .grant_setup import GRANT_ENV

CLIENT_CONFIG_INVALID = "client_config_invalid"


@dataclass(frozen=True)
class Client:
    key: str  # the command-line name: claude-code, claude-desktop, cursor, codex
    title: str  # how the person knows it
    toml: bool  # Codex: TOML; the others: JSON
    container: str  # the key holding the servers
    typed: bool = False  # Claude Code writes "type": "stdio" in each entry


CLIENTS: dict[str, Client] = {
    "claude-code": Client("claude-code", "Claude Code", False, "mcpServers", typed=True),
    "claude-desktop": Client("claude-desktop", "Claude Desktop", False, "mcpServers"),
    "cursor": Client("cursor", "Cursor", False, "mcpServers"),
    "codex": Client("codex", "Codex", True, "mcp_servers"),
}


def config_path(client: Client, environ: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """The client's user-level configuration file (``~`` is ``$HOME``)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    plat = sys.platform if platform is None else platform
    if client.key == "claude-code":
        return home / ".claude.json"
    if client.key == "claude-desktop":
        if plat == "darwin":
            return home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
        base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
        return base / "Claude" / "claude_desktop_config.json"
    if client.key == "cursor":
        return home / ".cursor" / "mcp.json"
    codex_home = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex"
    return codex_home / "config.toml"


def client_entry(client: Client, command: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The server entry in the client's format (a plain dict; TOML tables are built from it)."""
    entry: dict[str, Any] = {"type": "stdio"} if client.typed else {}
    entry.update({"command": command, "args": list(args), "env": dict(env)})
    return entry


@dataclass(frozen=True)
class GrantRef:
    """The vault and grant an installed entry's token names (``mg_<vault>_<grant>_<secret>``)."""

    vault_id: str
    grant_id: str


def memories_grant(entry: Any) -> GrantRef | None:
    """The grant of an entry that runs `memories mcp`, or None when the entry is not ours."""
    if not isinstance(entry, Mapping):
        return None
    env = entry.get("env")
    token = env.get(GRANT_ENV) if isinstance(env, Mapping) else None
    if not isinstance(token, str) or not token.startswith("mg_"):
        return None
    parts = token.split("_", 3)
    if len(parts) != 4 or not parts[1] or not parts[2]:
        return None
    return GrantRef(parts[1], parts[2])


def _invalid(path: Path, what: str) -> MemoriesError:
    return MemoriesError(
        f"{path} {what}: fix it (or move it away) and run the command again; it was not changed",
        code=CLIENT_CONFIG_INVALID,
    )


class ConfigFile:
    """One client configuration file, parsed; ``save`` writes it back with a backup."""

    def __init__(self, client: Client, path: Path) -> None:
        self.client = client
        self.path = path
        self.existed = False
        self.doc: Any = None
        self._load()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
            self.existed = True
        except FileNotFoundError:
            raw = b""
        except IsADirectoryError:
            raise _invalid(self.path, "is a directory") from None
        except OSError as exc:
            raise MemoriesError(f"cannot read {self.path} ({exc.strerror}): check its permissions", code="io_error") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(self.path, "is not UTF-8 text") from None
        if self.client.toml:
            import tomlkit
            from tomlkit.exceptions import TOMLKitError

            try:
                self.doc = tomlkit.parse(text)
            except TOMLKitError as exc:
                raise _invalid(self.path, f"is not valid TOML ({' '.join(str(exc).split())})") from None
        elif not text.strip():
            self.doc = {}
        else:
            try:
                self.doc = json.loads(text)
            except ValueError as exc:
                raise _invalid(self.path, f"is not valid JSON ({' '.join(str(exc).split())})") from None
        if not isinstance(self.doc, dict):
            raise _invalid(self.path, "does not hold a JSON object")
        servers = self.doc.get(self.client.container)
        if servers is not None and not isinstance(servers, dict):
            raise _invalid(self.path, f"has a {self.client.container} that is not a table of servers")

    def servers(self) -> dict[str, Any]:
        servers = self.doc.get(self.client.container)
        return servers if isinstance(servers, dict) else {}

    def get(self, name: str) -> Any:
        return self.servers().get(name)

    def set(self, name: str, entry: dict[str, Any]) -> None:
        if self.client.toml:
            import tomlkit

            if self.client.container not in self.doc:
                self.doc[self.client.container] = tomlkit.table(is_super_table=True)
            table = tomlkit.table()
            for key, value in entry.items():
                if isinstance(value, dict):
                    inline = tomlkit.inline_table()
                    inline.update(value)
                    table[key] = inline
                else:
                    table[key] = value
            table.add(tomlkit.nl())
            servers = self.doc[self.client.container]
            if name in servers:
                del servers[name]
            servers[name] = table
            return
        self.doc.setdefault(self.client.container, {})[name] = entry

    def remove(self, name: str) -> None:
        del self.doc[self.client.container][name]

    def dumps(self) -> str:
        if self.client.toml:
            import tomlkit

            return tomlkit.dumps(self.doc)
        return json.dumps(self.doc, indent=2, ensure_ascii=False) + "\n"

    def save(self) -> Path | None:
        """Back the old file up, then replace it atomically. Returns the backup (None: the file is new)."""
        target = Path(os.path.realpath(self.path))  # a symlinked dotfile stays a symlink
        backup: Path | None = None
        try:
            if self.existed:
                mode = stat.S_IMODE(target.stat().st_mode)
                backup = _backup(target)
            else:
                mode = 0o600  # it will hold a grant token
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(target, self.dumps(), mode)
        except OSError as exc:
            raise MemoriesError(
                f"cannot write {target} ({exc.strerror or 'I/O error'}): check the folder's permissions and free space",
                code="io_error",
            ) from None
        return backup


def _backup(target: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = target.with_name(f"{target.name}.bak.{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = target.with_name(f"{target.name}.bak.{stamp}-{n}")
    data = target.read_bytes()
    fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return candidate


def write_atomic(target: Path, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file beside ``target``, fsync, and rename it over ``target``."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def readable_by_others(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False


def snippet(client: Client, name: str, entry: dict[str, Any]) -> str:
    """The entry as it would appear in the client's file (for ``--print``)."""
    if client.toml:
        import tomlkit

        doc = tomlkit.document()
        holder = ConfigFile.__new__(ConfigFile)
        holder.client, holder.doc = client, doc
        holder.set(name, entry)
        return tomlkit.dumps(doc).rstrip("\n") + "\n"
    return json.dumps({client.container: {name: entry}}, indent=2, ensure_ascii=False) + "\n"
