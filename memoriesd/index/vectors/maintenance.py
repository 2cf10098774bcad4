"""A vault's sealed vector files as a whole: their names, the space list, compaction and status.

Functions over every sidecar of a vault, not one loaded vector space (that is
:class:`~memoriesd.index.vectors.space.VectorSpace`): the opaque sidecar id of a model identity, noting a
space in the sealed space list, the content keys of every live fragment, rewriting every sidecar
to the live fragments after compaction or ``memory forget`` (:func:`compact_vectors`), and
``rag status`` counts before any vector is loaded (:func:`sealed_status`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...vault import crypto
from ...vault.keys import VaultKeys
from ...vault.rekey import Rekeying
from ...vault.store import VaultStore
from ..docs import embed_input
from .matrix import vector_bytes
from .names import (
    SPACES_NAME,
    content_key,
    entry_key,
    is_legacy_key,
    list_sidecars,
    read_spaces,
    register_in_spaces,
    sidecar_opaque_id,
    sidecar_path,
    write_spaces,
)
from .rewrite import reseal, retain
from .sidecar import VectorStore

log = logging.getLogger("memoriesd.vectors")



class _Space(Protocol):
    """The index's vector space (:class:`memoriesd.index.vectors.space.VectorSpace`) as compaction uses it."""

    @property
    def lock(self) -> AbstractContextManager[object]: ...

    @property
    def sidecar(self) -> VectorStore: ...

    def retain(self, keep: Collection[str], rename: dict[str, str] | None = None) -> tuple[int, int] | None: ...


class LockedIndex(Protocol):
    """What :func:`compact_vectors` holds of a vault's index (:class:`memoriesd.index.caches.VaultIndex`):
    its lock, and the lock of its vector space when it has one."""

    @property
    def lock(self) -> AbstractContextManager[object]: ...

    @property
    def vectors(self) -> _Space | None: ...


def sidecar_id(keys: VaultKeys, identity: str) -> str:
    """The opaque file id of a model's vector sidecar in a vault (the model identity is not on disk)."""
    return keys.mac(crypto.LABEL_VECTOR_NAMES, identity.encode("utf-8")).hex()[:32]


_spaces_lock = threading.Lock()  # read-modify-write of a vault's vector-spaces.bin


def register_space(store: VaultStore, sealer: crypto.Sealer, identity: str, dims: int) -> None:
    """Note in the vault's sealed space list that ``identity`` (``dims``) is in use now, so
    compaction can open its sidecar and status can count it before the model is loaded."""
    oid = sidecar_id(store.keys, identity)
    with _spaces_lock:
        entry = {"identity": identity, "dims": int(dims), "used": time.time()}
        try:
            register_in_spaces(store.dir, oid, entry, vault_id=store.vault_id, seal=sealer.seal, open_=sealer.open)
        except OSError as exc:
            log.warning("vault %s: cannot write the vector space list (%s)", store.vault_id, exc.strerror)


def _embed_inputs(store: VaultStore, fp_key: bytes, *, legacy: bool, windows: bool) -> Iterator[tuple[str | None, str, str | None]]:
    """``(title, text, old-scheme key or None)`` of what the embedder reads for every fragment (then
    turn window) of the vault's live, searchable records, as the index builds them."""
    from ..docs import index_doc

    for rec in store.latest():
        if not rec.searchable:
            continue
        doc = index_doc(rec, fp_key)
        for frag in doc.fragments:
            title, text = embed_input(doc, frag)
            yield title, text, (entry_key(frag.fingerprint, doc.title) if legacy else None)
        for wins in doc.windows if windows else ():
            for w in wins:
                title, text = embed_input(doc, w)
                yield title, text, None


def live_fragment_keys(store: VaultStore, *, legacy: bool = False, windows: bool = True) -> list[tuple[str, str | None]]:
    """``(content key, old-scheme key or None)`` of every fragment of the vault's live, searchable
    records (one per fragment), computed exactly as the index does (same fragments, same
    fingerprint subkey, same embedder input); builds no index. ``legacy``: also the key the
    fragment's vector had before content keys (to read or re-key an old sidecar). ``windows``:
    then the keys of the conversation fragments' turn windows (which never had an old-scheme key)."""
    fp_key = store.keys.subkey(crypto.LABEL_FINGERPRINT)
    try:
        return [
            (content_key(fp_key, title, text), old)
            for title, text, old in _embed_inputs(store, bytes(fp_key), legacy=legacy, windows=windows)
        ]
    finally:
        crypto.wipe(fp_key)


def rekey_vectors(rk: Rekeying) -> dict[str, int]:
    """A key change's stage for sealed vectors (:class:`~memoriesd.vault.rekey.Rekeying`): every
    sidecar whose model the space list names is sealed again under the new key, named for it, its
    vectors keyed by the new key's content keys, each row in the encoding it had; the space list
    too. Nothing is embedded again. Vectors of no live fragment go (as in compaction), and so does
    a sidecar of unknown model identity (it cannot be opened: it is removed with the old key's
    files, and recomputed if its model is used again)."""
    store = rk.store
    stats = {"vector_entries_kept": 0, "vector_entries_dropped": 0, "vector_files": 0}
    old = store.keys.sealer(crypto.LABEL_VECTORS)
    new = rk.new_keys.sealer(crypto.LABEL_VECTORS)
    try:
        spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=old.open)
        if not spaces:
            return stats
        rename: dict[str, str] | None = None
        new_spaces: dict[str, dict[str, object]] = {}
        for oid, entry in spaces.items():
            identity, dims = str(entry["identity"]), int(str(entry["dims"]))
            new_oid = sidecar_id(rk.new_keys, identity)
            new_spaces[new_oid] = dict(entry)
            path = sidecar_path(store.dir, oid)
            if not path.exists():
                continue
            if rename is None:
                rename = _rekey_map(store, rk.new_keys)
            src = VectorStore(path, vault_id=store.vault_id, identity=identity, dims=dims, seal=old.seal, open_=old.open)
            dst = VectorStore(
                rk.staged(sidecar_path(store.dir, new_oid).name),
                vault_id=store.vault_id, identity=identity, dims=dims, seal=new.seal, open_=new.open,
            )
            got = reseal(src, dst, rename)
            if got is not None:
                stats["vector_files"] += 1 if got[0] else 0
                stats["vector_entries_kept"] += got[0]
                stats["vector_entries_dropped"] += got[1]
        write_spaces(store.dir, new_spaces, vault_id=store.vault_id, seal=new.seal, name=rk.staged(SPACES_NAME).name)
        return stats
    finally:
        old.wipe()
        new.wipe()


def _rekey_map(store: VaultStore, new_keys: VaultKeys) -> dict[str, str]:
    """Old content key (and old-scheme key) -> the new key's content key, of every live fragment
    and turn window: the same model input under the two fingerprint subkeys."""
    old_fp = store.keys.subkey(crypto.LABEL_FINGERPRINT)
    new_fp = new_keys.subkey(crypto.LABEL_FINGERPRINT)
    try:
        out: dict[str, str] = {}
        for title, text, legacy in _embed_inputs(store, bytes(old_fp), legacy=True, windows=True):
            new = content_key(new_fp, title, text)
            out[content_key(old_fp, title, text)] = new
            if legacy is not None:
                out.setdefault(legacy, new)
        return out
    finally:
        crypto.wipe(old_fp)
        crypto.wipe(new_fp)


def _legacy_rename(pairs: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    return {old: new for new, old in pairs if old is not None}


def compact_vectors(store: VaultStore, vault_index: LockedIndex | None = None) -> dict[str, int]:
    """After the log is compacted: rewrite every sealed sidecar of the vault whose model the space
    list knows so it holds only vectors of live, searchable fragments (deleted records, old revisions
    and old titles go); a sidecar left empty is removed. A sidecar of unknown identity (written
    before the space list existed and not used since) cannot be opened: it is kept and counted.

    Holds the index lock (no vector space is created or replaced meanwhile), the attached space's
    lock (no append interleaves) and the store lock (the key stays valid, records do not change).
    """
    stats = {"vector_entries_kept": 0, "vector_entries_dropped": 0, "vector_files": 0, "vector_files_skipped": 0}
    with contextlib.ExitStack() as stack:
        if vault_index is not None:
            stack.enter_context(vault_index.lock)
        space = vault_index.vectors if vault_index is not None else None
        if space is not None:
            stack.enter_context(space.lock)
        with store.exclusive():
            pairs = live_fragment_keys(store, legacy=True)  # raises VaultLocked when locked meanwhile
            keep = {new for new, _ in pairs}
            rename = _legacy_rename(pairs)  # a sidecar not re-keyed yet keeps its live vectors
            sealer = store.keys.sealer(crypto.LABEL_VECTORS)
            try:
                spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
                for path in list_sidecars(store.dir):
                    if space is not None and path == space.sidecar.path:
                        result = space.retain(keep, rename)
                    elif sidecar_opaque_id(path) in spaces:
                        entry = spaces[sidecar_opaque_id(path)]
                        result = retain(VectorStore(
                            path,
                            vault_id=store.vault_id,
                            identity=str(entry["identity"]),
                            dims=int(str(entry["dims"])),
                            seal=sealer.seal,
                            open_=sealer.open,
                        ), keep, rename)
                    else:
                        stats["vector_files_skipped"] += 1
                        log.warning("vault %s: vector cache %s has no known model identity; left as is",
                                    store.vault_id, path.name)
                        continue
                    if result is not None:
                        stats["vector_files"] += 1
                        stats["vector_entries_kept"] += result[0]
                        stats["vector_entries_dropped"] += result[1]
            finally:
                sealer.wipe()
    return stats


def sealed_status(
    store: VaultStore, *, identity: str | None, dims: int | None, remote: bool, windows: bool = True
) -> dict[str, Any] | None:
    """``rag status`` before vectors are loaded: how many live fragments (and, with ``windows``,
    turn windows) have a sealed vector.

    ``identity``/``dims`` are the active embedder's when known without loading a model; else the
    identity this vault used last (local or remote as ``remote`` says) from its space list. Reads
    the space list and one sidecar's keys; embeds nothing and builds no index. None when unknown.
    """
    sealer = store.keys.sealer(crypto.LABEL_VECTORS)
    try:
        spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
        if identity is None:
            used = [(float(str(e["used"])), oid) for oid, e in spaces.items() if str(e["identity"]).startswith("remote:") == remote]
            if not used:
                if list_sidecars(store.dir):
                    return None  # vectors of an identity this daemon cannot name yet
                return {"embedded": 0, "total": len(live_fragment_keys(store, windows=windows)), "vector_bytes": 0}
            oid = max(used)[1]
            identity, dims = str(spaces[oid]["identity"]), int(str(spaces[oid]["dims"]))
        else:
            oid = sidecar_id(store.keys, identity)
            if dims is None and oid in spaces:
                dims = int(str(spaces[oid]["dims"]))
        path = sidecar_path(store.dir, oid)
        if not path.exists():
            keys: set[str] | None = set()
        elif dims is None:
            return None
        else:
            keys = VectorStore(
                path, vault_id=store.vault_id, identity=identity, dims=dims, seal=sealer.seal, open_=sealer.open
            ).peek_keys()
        if keys is None:
            return None
    finally:
        sealer.wipe()
    legacy = any(is_legacy_key(k) for k in keys)  # a sidecar not re-keyed yet (first attach does it)
    frag_keys = live_fragment_keys(store, legacy=legacy, windows=windows)
    embedded = sum(1 for new, old in frag_keys if new in keys or (old is not None and old in keys))
    out: dict[str, Any] = {"model": identity, "embedded": embedded, "total": len(frag_keys)}
    if dims is not None:
        out["dimensions"] = dims
        out["vector_bytes"] = vector_bytes(embedded, dims)
    else:
        out["vector_bytes"] = 0
    return out


__all__ = ["compact_vectors", "live_fragment_keys", "register_space", "rekey_vectors", "sealed_status", "sidecar_id"]
