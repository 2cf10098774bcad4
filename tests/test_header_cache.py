"""Vault headers are parsed again only when header.json changes (not on every request)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memoriesd.vault import headers
from memoriesd.vault.headers import HeaderCache


def _write(vault_dir: Path, name: str, *, replace: bool) -> None:
    doc = json.dumps({"vault_id": vault_dir.name, "name": name})
    if replace:  # as the daemon writes it: a new file renamed over the old one
        tmp = vault_dir / "header.json.tmp"
        tmp.write_text(doc, "utf-8")
        os.replace(tmp, vault_dir / "header.json")
    else:  # an edit in place
        (vault_dir / "header.json").write_text(doc, "utf-8")


def test_a_header_is_parsed_again_only_after_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[Path] = []
    real = headers.public_header

    def counting(vault_dir: Path) -> dict[str, str] | None:
        parsed.append(vault_dir)
        return real(vault_dir)

    monkeypatch.setattr(headers, "public_header", counting)
    vault = tmp_path / "v1"
    vault.mkdir()
    _write(vault, "notes", replace=True)
    cache = HeaderCache()
    assert cache.public(vault) == {"vault_id": "v1", "name": "notes"}
    got = cache.public(vault)
    assert got == {"vault_id": "v1", "name": "notes"} and len(parsed) == 1  # unchanged: no second parse
    got["locked"] = True  # callers add fields to their copy, never to the cached entry
    assert cache.public(vault) == {"vault_id": "v1", "name": "notes"}

    _write(vault, "journal", replace=True)  # a rename: new inode
    assert cache.public(vault) == {"vault_id": "v1", "name": "journal"} and len(parsed) == 2
    _write(vault, "journal two", replace=False)  # edited in place: new size and mtime
    assert cache.public(vault) == {"vault_id": "v1", "name": "journal two"} and len(parsed) == 3
    (vault / "header.json").unlink()
    assert cache.public(vault) is None
