"""The first vector search after unlock: the sealed sidecar read a chunk at a time straight into the
in-memory index (``VectorStore.scan``, ``VectorSpace.attach``), and the vectors' content keys taken
from the restored lexical snapshot instead of being computed again.

In-process on a real vault (cheap KDF), real SQLite/FTS5 and jieba, real sealed files; vectors come
from the deterministic bag-of-words of ``tests/embed_server.py`` (what is tested is loading them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memoriesd.index.vectors.space as rag_vectors
from memoriesd.config import CacheConfig
from memoriesd.index.caches import VaultIndex
from memoriesd.index.docs import embed_input
from memoriesd.index.vectors.names import content_key
from memoriesd.index.vectors.space import VectorSpace
from memoriesd.text.segment import configure
from memoriesd.vault import crypto
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import KdfParams, VaultStore

from .embed_server import bag_vector
from .test_vectors import assert_same, make_entries, store

DIMS = 48
PASS = b"correct horse"


def take_all(into: dict[str, np.ndarray]) -> Any:
    def take(keys: list[str], rows: np.ndarray) -> None:
        for k, r in zip(keys, rows, strict=True):
            into[k] = np.array(r)

    return take


def test_scan_hands_over_exactly_what_load_returns_a_chunk_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "vectors-scanned01.bin"
    s = store(path)
    s.append(make_entries(3000, seed=1, prefix="a"))  # two chunks
    dup = make_entries(5, seed=2, prefix="a")  # the same keys again: the later vectors win
    s.append(dup)
    with open(path, "ab") as fh:  # an uncommitted tail (a crash mid-append) is not read
        fh.write(os.urandom(500))
    got: dict[str, np.ndarray] = {}
    chunks: list[int] = []

    def take(keys: list[str], rows: np.ndarray) -> None:
        chunks.append(len(keys))
        assert not rows.flags.writeable  # a view of the opened chunk, no copy
        take_all(got)(keys, rows)

    assert store(path).scan(take) is True
    assert chunks == [2048, 952, 5]
    assert_same(got, store(path).load())


@pytest.mark.parametrize("where", ["last-chunk", "commit", "cut"])
def test_a_damaged_sidecar_scans_as_false_and_is_discarded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    path = tmp_path / "vectors-damaged01.bin"
    s = store(path)
    s.append(make_entries(2100, seed=1))
    raw = bytearray(path.read_bytes())
    if where == "cut":
        raw = raw[:-300]
    else:
        raw[len(raw) - 50 if where == "last-chunk" else 8 + 20] ^= 0x01
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        assert store(path).scan(take_all({})) is False
    assert "damaged" in caplog.text and not path.exists()
    assert store(path).scan(take_all({})) is None  # none any more


def test_an_error_of_the_caller_propagates_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "vectors-callerr1.bin"
    store(path).rewrite(make_entries(10))

    def take(keys: list[str], rows: np.ndarray) -> None:
        raise crypto.KeyWiped("locked meanwhile")

    with pytest.raises(crypto.KeyWiped):
        store(path).scan(take)
    assert len(store(path).load()) == 10


# -- a real vault ---------------------------------------------------------------------------------


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Path]:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    configure(cache)
    vdir = tmp_path / "v" / "vaultid00001"
    vdir.parent.mkdir()
    st = VaultStore.create(vdir, "vaultid00001", "v", PASS, KdfParams(memory_kib=64, iterations=1, lanes=1))
    words = "harbour lantern orchard pebble quartz meadow falcon glacier".split()
    recs = []
    for i in range(60):
        body = "\n\n".join(" ".join(words[(i + j + k) % 8] for k in range(60)) + f" para{j}" for j in range(4))
        title = f"Note {i}" if i % 3 else ""
        kind = "card" if i % 2 else "memory"
        meta = {"path": f"n{i}.md"} if kind == "card" else {}
        recs.append(Record(new_record_id(), 1, kind, title, (f"# {title}\n\n" if title else "") + body, False, (),
                           meta, {}, now(), now()))
    recs.append(Record(new_record_id(), 1, "memory", "Title only", "", False, (), {}, {}, now(), now()))
    st.commit(recs)
    st.close()
    yield vdir


def open_index(vdir: Path) -> tuple[VaultStore, VaultIndex]:
    st = VaultStore.open(vdir, passphrase=PASS)
    idx = VaultIndex(st, CacheConfig())
    idx.refresh()
    return st, idx


def close(st: VaultStore, idx: VaultIndex) -> None:
    idx.close()
    st.close()


def embed(items: list[tuple[str | None, str]]) -> np.ndarray:
    return np.asarray([bag_vector(f"{t or ''} {x}", DIMS) for t, x in items], dtype=np.float32)


def test_content_keys_restored_with_the_snapshot_are_the_computed_ones(vault: Path) -> None:
    st, idx = open_index(vault)
    assert idx.bm25 is not None and idx.bm25.candidates("harbour", limit=5).hits  # FTS5 rows: a snapshot is due
    assert idx.keeper is not None and idx.keeper.write("test")
    close(st, idx)
    st, idx = open_index(vault)
    try:
        assert idx.snapshot_info["source"] == "snapshot"
        fp = crypto.subkey(st.key, crypto.LABEL_FINGERPRINT)
        live = idx.live_frag_ids()
        assert len(live) > 60
        for fid in live:
            doc, frag = idx.fragment(fid)
            assert idx.keeper is not None
            assert idx.keeper.content_key_for(doc, frag) == content_key(fp, *embed_input(doc, frag))
    finally:
        close(st, idx)


def _embedded_vault(vault: Path) -> None:
    st, idx = open_index(vault)
    space = VectorSpace(idx, "bag-test", DIMS, 128)
    idx.vectors = space
    space.attach(idx)
    assert space.embed(idx, space.missing(idx), embed, check=lambda: None) == len(idx.live_frag_ids())
    idx.bm25.candidates("harbour", limit=5)  # type: ignore[union-attr]
    idx.keeper.write("test")  # type: ignore[union-attr]
    close(st, idx)


def _attached(vault: Path, whole_file: bool) -> tuple[VaultStore, VaultIndex, VectorSpace]:
    old = rag_vectors._WHOLE_FILE_LOAD
    rag_vectors._WHOLE_FILE_LOAD = whole_file  # the benchmark's before/after switch
    try:
        st, idx = open_index(vault)
        space = VectorSpace(idx, "bag-test", DIMS, 128)
        idx.vectors = space
        space.attach(idx)
        return st, idx, space
    finally:
        rag_vectors._WHOLE_FILE_LOAD = old


def test_streamed_sidecar_gives_the_index_the_whole_file_load_gives(vault: Path) -> None:
    _embedded_vault(vault)
    st, idx, streamed = _attached(vault, whole_file=False)
    try:
        rows = {fid: streamed.index.get(fid) for fid in idx.live_frag_ids()}
        assert streamed.missing(idx) == [] and streamed.index.precision == "int8"
    finally:
        close(st, idx)
    st, idx, whole = _attached(vault, whole_file=True)
    try:
        assert whole.missing(idx) == []
        for fid, row in rows.items():
            np.testing.assert_array_equal(whole.index.get(fid), row)
    finally:
        close(st, idx)


def test_a_sidecar_damaged_after_its_first_chunks_adds_no_vector(vault: Path, caplog: pytest.LogCaptureFixture) -> None:
    _embedded_vault(vault)
    [path] = vault.glob("vectors-*.bin")
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0x01  # the last chunk: the ones before it authenticate and are read first
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        st, idx, space = _attached(vault, whole_file=False)
    try:
        assert len(space.index) == 0 and len(space.missing(idx)) == len(idx.live_frag_ids())
        assert not path.exists() and "damaged" in caplog.text
    finally:
        close(st, idx)
