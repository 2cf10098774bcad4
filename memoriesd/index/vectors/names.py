"""What sealed vectors are called: each vector's key, each sidecar's file name, and the space list.

A vector is keyed by its content (:func:`content_key`): a keyed hash of exactly what the embedder
reads, so the same input reuses its vector wherever it is and an edit re-embeds only what changed.
Sidecars written before content keys hold :func:`entry_key` keys (fragment fingerprint + title
hash); :func:`rekeyed` maps them once, without re-embedding.

A sidecar's name is ``vectors-<id>.bin`` with an opaque id the caller derives with the vault key
(a keyed hash of the model identity), so the name reveals neither the model nor any text. A sidecar
cannot be opened without its model identity and dimensions (they are in its AAD), so the vault
directory also holds ``vector-spaces.bin``: one sealed record (AAD = vault id) listing, per sidecar
id, the identity, dimensions and last use. It lets compaction filter the sidecars of every model
the vault used, and status count sealed vectors before the model is loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ...vault.format import atomic_write
from .chunks import CONTENT_KEY_HEX

log = logging.getLogger("memoriesd.vectors")

Seal = Callable[[bytes, bytes], bytes]
Open = Callable[[bytes, bytes], bytes]
_OPAQUE_ID = re.compile(r"[A-Za-z0-9_-]{8,128}")


class _Damage(Exception):
    """The file is not readable (reason is safe to log)."""


def _damage_reason(exc: Exception) -> str:
    """Why a file could not be parsed, safe to log (never its content)."""
    return str(exc) if isinstance(exc, _Damage) else f"unreadable: {type(exc).__name__}"


def sidecar_path(vault_dir: Path, opaque_id: str) -> Path:
    """``vault_dir/vectors-<opaque_id>.bin``; the id must be a keyed hash the caller computed."""
    if not _OPAQUE_ID.fullmatch(opaque_id):
        raise ValueError("opaque_id must be 8-128 characters of [A-Za-z0-9_-]")
    return Path(vault_dir) / f"vectors-{opaque_id}.bin"


def list_sidecars(vault_dir: Path) -> list[Path]:
    """Every vector sidecar in a vault directory (to remove those of models no longer used)."""
    return sorted(p for p in Path(vault_dir).glob("vectors-*.bin") if p.is_file())


def sidecar_opaque_id(path: Path) -> str:
    """The opaque id in a sidecar's file name (inverse of :func:`sidecar_path`)."""
    return Path(path).name[len("vectors-") : -len(".bin")]


# -- the list of vector spaces (identity and dimensions of each sidecar) ---------------------

SPACES_NAME = "vector-spaces.bin"
_SPACES_MAGIC = b"MEMVSP\x00\x01"


def _spaces_aad(vault_id: str) -> bytes:
    return b"memories/v1/vector-spaces\0" + vault_id.encode("utf-8")


class SpacesDamaged(Exception):
    """The space list cannot name every sidecar: it cannot be read or opened, or it was written
    again after it was damaged (sidecars of other models may be unnamed). Reason safe to log."""


def _read_doc(vault_dir: Path, vault_id: str, open_: Open) -> dict[str, object] | None:
    """The opened list; None when missing; :class:`SpacesDamaged` when unreadable or damaged."""
    try:
        data = (Path(vault_dir) / SPACES_NAME).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SpacesDamaged(f"unreadable: {exc.strerror}") from exc
    try:
        if data[: len(_SPACES_MAGIC)] != _SPACES_MAGIC:
            raise _Damage("not a vector space list of this version")
        doc = json.loads(open_(data[len(_SPACES_MAGIC) :], _spaces_aad(vault_id)))
        spaces: dict[str, dict[str, object]] = {}
        for oid, entry in dict(doc["spaces"]).items():
            if _OPAQUE_ID.fullmatch(str(oid)) and isinstance(entry.get("identity"), str) and int(entry["dims"]) > 0:
                spaces[str(oid)] = {"identity": entry["identity"], "dims": int(entry["dims"]), "used": float(entry.get("used", 0))}
        return {"spaces": spaces, "rebuilt": bool(doc.get("rebuilt", False))}
    except MemoryError:
        raise
    except Exception as exc:
        raise SpacesDamaged(_damage_reason(exc)) from exc


def read_spaces(
    vault_dir: Path, *, vault_id: str, open_: Open, strict: bool = False
) -> dict[str, dict[str, object]]:
    """``{opaque id: {"identity", "dims", "used"}}`` from ``vector-spaces.bin``; {} when it is
    missing. When it cannot be read or is damaged: {} with a WARNING (derived data). With
    ``strict`` (a caller that would otherwise take every sidecar for one of no known model, which
    ``memory forget`` removes) :class:`SpacesDamaged` instead, also when the list was written
    again after damage (:func:`register_in_spaces`) while sidecars it does not name remain."""
    try:
        doc = _read_doc(vault_dir, vault_id, open_)
    except SpacesDamaged as exc:
        if strict:
            raise
        log.warning("vector space list %s is damaged (%s); ignored", SPACES_NAME, exc)
        return {}
    if doc is None:
        return {}
    spaces: dict[str, dict[str, object]] = doc["spaces"]  # type: ignore[assignment]
    if strict and doc["rebuilt"] and any(sidecar_opaque_id(p) not in spaces for p in list_sidecars(vault_dir)):
        raise SpacesDamaged("it was written again after damage, so it may not name every model's vectors")
    return spaces


def register_in_spaces(
    vault_dir: Path, oid: str, entry: Mapping[str, object], *, vault_id: str, seal: Seal, open_: Open
) -> None:
    """Add or refresh one space (read, modify, write: the caller serialises). A damaged list is
    replaced by one marked ``rebuilt`` (logged): the sidecars of the models it named are kept, and
    stay kept by ``memory forget`` (:func:`read_spaces` strict) until each is named again or gone."""
    try:
        doc = _read_doc(vault_dir, vault_id, open_)
    except SpacesDamaged as exc:
        log.warning("vector space list %s is damaged (%s); written again with this model only: the vector "
                    "files of other models are kept until each is used again", SPACES_NAME, exc)
        doc = {"spaces": {}, "rebuilt": True}
    if doc is None:
        doc = {"spaces": {}, "rebuilt": False}
    spaces: dict[str, dict[str, object]] = doc["spaces"]  # type: ignore[assignment]
    spaces[oid] = dict(entry)
    rebuilt = bool(doc["rebuilt"]) and any(sidecar_opaque_id(p) not in spaces for p in list_sidecars(vault_dir))
    write_spaces(vault_dir, spaces, vault_id=vault_id, seal=seal, rebuilt=rebuilt)


def write_spaces(
    vault_dir: Path, spaces: Mapping[str, Mapping[str, object]], *, vault_id: str, seal: Seal, name: str = SPACES_NAME,
    rebuilt: bool = False,
) -> None:
    """Replace ``vector-spaces.bin`` (or ``name``: a key change stages it) atomically (temp file
    0600, fsync, rename, fsync dir). ``rebuilt``: written after damage (:func:`register_in_spaces`)."""
    doc: dict[str, object] = {"spaces": {k: dict(v) for k, v in spaces.items()}}
    if rebuilt:
        doc["rebuilt"] = True
    plain = json.dumps(doc, sort_keys=True).encode("utf-8")
    atomic_write(Path(vault_dir) / name, _SPACES_MAGIC + seal(plain, _spaces_aad(vault_id)))


_CONTENT_LABEL = b"memories/v2/vector-input\0"


def content_key(key: bytes | bytearray, title: str | None, text: str) -> str:
    """Key of a vector: HMAC-SHA256 under ``key`` (the vault's fingerprint subkey) over exactly what
    the embedder reads, ``(title or None, text)``, each part length-prefixed (no two inputs share an
    encoding). Identical model input gives the identical key, whatever the record or byte offsets:
    an edit re-embeds only the fragments whose input changed."""
    parts = [_CONTENT_LABEL]
    if title is None:
        parts.append(b"\0")
    else:
        raw = title.encode("utf-8")
        parts.append(b"\1" + struct.pack(">Q", len(raw)) + raw)
    data = text.encode("utf-8")
    parts.append(struct.pack(">Q", len(data)) + data)
    return hmac.digest(key, b"".join(parts), "sha256").hex()[:CONTENT_KEY_HEX]


def entry_key(fingerprint: str, title: str | None) -> str:
    """The key of sidecars written before content keys: fragment fingerprint (byte offsets +
    bytes) plus a hash of the record's title. Only used to re-key such files (see
    :func:`is_legacy_key`)."""
    digest = hashlib.sha256(b"memories/v1/vector-title\0" + (title or "").encode("utf-8")).hexdigest()
    return f"{fingerprint}.{digest[:32]}"


def is_legacy_key(key: str) -> bool:
    """Whether ``key`` is an :func:`entry_key` (old scheme), not a :func:`content_key`."""
    return "." in key


def rekeyed(entries: Mapping[str, np.ndarray], rename: Mapping[str, str]) -> dict[str, np.ndarray]:
    """``entries`` with old-scheme keys replaced as ``rename`` says (an entry already under the new
    key wins); old-scheme keys ``rename`` does not know are dropped (no live fragment has them)."""
    out = {k: v for k, v in entries.items() if not is_legacy_key(k)}
    for k, v in entries.items():
        if is_legacy_key(k):
            new = rename.get(k)
            if new is not None and new not in out:
                out[new] = v
    return out


__all__ = [
    "CONTENT_KEY_HEX", "SPACES_NAME", "content_key", "entry_key", "is_legacy_key", "list_sidecars", "read_spaces",
    "rekeyed", "sidecar_opaque_id", "sidecar_path", "write_spaces",
]
