"""Keyring backends for tests (priority -1: never chosen as a default)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from keyring.backend import KeyringBackend
from keyring.errors import KeyringError, PasswordDeleteError


class MemoryKeyring(KeyringBackend):
    priority = -1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self._store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self._store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self._store.pop((service, username), None)


class FileKeyring(KeyringBackend):
    """A keyring that outlives the process, as the OS keyring does: JSON in the file named by
    ``$MEMORIES_TEST_KEYRING`` (each unlocked vault runs in a process of its own)."""

    priority = -1  # type: ignore[assignment]

    def _path(self) -> Path:
        return Path(os.environ["MEMORIES_TEST_KEYRING"])

    def _load(self) -> dict[str, str]:
        p = self._path()
        return dict(json.loads(p.read_text())) if p.exists() else {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}\0{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._load()
        data[f"{service}\0{username}"] = password
        self._path().write_text(json.dumps(data))

    def delete_password(self, service: str, username: str) -> None:
        data = self._load()
        data.pop(f"{service}\0{username}", None)
        self._path().write_text(json.dumps(data))


class DeleteFailingFileKeyring(FileKeyring):
    """:class:`FileKeyring` whose deletes fail, as a locked or broken OS keyring's do (and as
    most backends' do for an entry never stored): reads and writes work."""

    def delete_password(self, service: str, username: str) -> None:
        raise PasswordDeleteError("the keyring is locked")


class FailingFileKeyring(DeleteFailingFileKeyring):
    """:class:`FileKeyring` whose reads and deletes fail, as a locked or broken OS keyring's do
    (``set_password`` still works, so a vault can be remembered first)."""

    def get_password(self, service: str, username: str) -> str | None:
        raise KeyringError("the keyring is locked")
