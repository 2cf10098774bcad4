"""TEMPORARY (lead's stub until the transports branch lands): folder transport only."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import MemoriesError


class TargetError(MemoriesError):
    code = "sync_target"
    exit_code = 1


@dataclass(frozen=True)
class Entry:
    name: str
    size: int


class Transport(Protocol):
    scheme: str

    def describe(self) -> str: ...
    def list(self) -> list[Entry]: ...
    def read(self, name: str) -> bytes | None: ...
    def write(self, name: str, data: bytes) -> None: ...
    def delete(self, name: str) -> None: ...
    def ensure(self) -> None: ...


class FolderTransport:
    scheme = "folder"

    def __init__(self, path: str) -> None:
        self.root = Path(path)

    def describe(self) -> str:
        return str(self.root)

    def list(self) -> list[Entry]:
        try:
            return [Entry(e.name, e.stat().st_size) for e in os.scandir(self.root) if e.is_file(follow_symlinks=False)]
        except OSError as exc:
            raise TargetError(f"the sync folder {self.root} cannot be read ({exc.strerror}): is it mounted?") from exc

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        tmp = self.root / f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.root / name)

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.root / name)
        except FileNotFoundError:
            pass

    def ensure(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)


def parse_target(text: str, **_: object) -> Transport:
    return FolderTransport(os.path.abspath(os.path.expanduser(text)))
