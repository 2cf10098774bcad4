"""Sealed vector rows in the index's own precision (sidecar version 2, docs/format.md): int8 rows are
sealed as the index holds them and loaded back byte for byte; a version-1 sidecar (float32 rows) is
still read and rewritten once as version 2; a rewrite never widens rows; damage discards the file."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memoriesd.index.vectors.load import SidecarMatch
from memoriesd.index.vectors.matrix import VectorIndex
from memoriesd.index.vectors.names import read_spaces, sidecar_opaque_id
from memoriesd.index.vectors.rewrite import repack, retain
from memoriesd.index.vectors.sidecar import MAGIC, MAGIC_V1, VectorStore
from memoriesd.vault import crypto
from memoriesd.vault.store import VaultStore

from .conftest import Daemon, create_vault, short_tmpdir, write_config
from .tinymodel import TOPIC_NOTES, two_tiny_models

DIMS = 48
PASS = "correct horse"


def _store(path: Path, encoding: str = "int8", key: bytes = b"k" * 32) -> VectorStore:
    s = crypto.Sealer(key, crypto.LABEL_VECTORS)
    return VectorStore(path, vault_id="vencodings01", identity="local:test", dims=DIMS, seal=s.seal, open_=s.open,
                       encoding=encoding)


def _vectors(n: int, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"{i:032x}": (rng.standard_normal(DIMS) * (i % 5 + 1)).astype(np.float32) for i in range(n)}


def _load_index(store: VectorStore, wanted: dict[int, str], precision: str) -> tuple[VectorIndex, dict[str, np.ndarray]]:
    spares: dict[str, np.ndarray] = {}

    def spare(keys: list[str], rows: np.ndarray) -> None:
        spares.update(zip(keys, rows, strict=True))

    fids = np.fromiter(wanted, dtype=np.int64, count=len(wanted))
    keys = np.array(list(wanted.values()), dtype="S32")
    match = SidecarMatch((fids, keys), DIMS, precision, spare)
    assert store.scan_chunks(match.take) is True
    got = match.result()
    index = VectorIndex(DIMS, precision=precision)
    index.add_encoded(got.fids, precision, got.rows, got.scales, adopt=True)
    return index, spares


def test_int8_rows_load_into_the_index_exactly_as_it_would_encode_them(tmp_path: Path) -> None:
    vecs = _vectors(300)
    store = _store(tmp_path / "v.bin")
    keys = list(vecs)
    store.rewrite({k: vecs[k] for k in keys[:200]})
    store.append({k: vecs[k] for k in keys[200:]})
    assert store.path.read_bytes()[:8] == MAGIC
    # Fragments 0..249 want keys 0..249; fragment 1000 has the same input as fragment 3.
    wanted = {i: keys[i] for i in range(250)} | {1000: keys[3]}
    index, spares = _load_index(_store(tmp_path / "v.bin"), wanted, "int8")
    expect = VectorIndex.build(list(range(250)) + [1000], np.stack([vecs[keys[i]] for i in range(250)] + [vecs[keys[3]]]),
                               precision="int8")
    assert len(index) == 251 and sorted(spares) == keys[250:]
    for fid in list(range(250)) + [1000]:
        r, e = index._row[fid], expect._row[fid]
        assert np.array_equal(index._buf[r], expect._buf[e]) and index._scale[r] == expect._scale[e]
    q = vecs[keys[10]]
    assert index.search(q, 5) == expect.search(q, 5)
    # Spares come back as unit-length float32 rows of the same direction.
    for k in keys[250:260]:
        assert abs(float(np.dot(spares[k], vecs[k]) / np.linalg.norm(vecs[k])) - 1.0) < 2e-3


def test_a_later_duplicate_wins_and_float32_rows_load_into_an_int8_index(tmp_path: Path) -> None:
    vecs = _vectors(10)
    keys = list(vecs)
    store = _store(tmp_path / "v.bin", encoding="float32")
    store.rewrite(vecs)
    flipped = -vecs[keys[2]]
    store.append({keys[2]: flipped})
    index, _ = _load_index(_store(tmp_path / "v.bin", encoding="float32"), {i: keys[i] for i in range(10)}, "int8")
    got = index.get(2)
    assert got is not None and float(np.dot(got, flipped) / np.linalg.norm(flipped)) > 0.999


def test_a_version_1_sidecar_is_read_and_narrowed_once(tmp_path: Path) -> None:
    vecs = _vectors(100)
    path = tmp_path / "v.bin"
    _store(path, encoding="float32")._rewrite(vecs, "float32", version=1)
    assert path.read_bytes()[:8] == MAGIC_V1
    old_size = path.stat().st_size
    store = _store(path, encoding="int8")
    loaded = store.load()
    assert set(loaded) == set(vecs) and all(np.array_equal(loaded[k], vecs[k]) for k in vecs)
    assert store.needs_narrowing and store.needs_repack
    assert repack(store) == 100
    assert path.read_bytes()[:8] == MAGIC and path.stat().st_size < old_size / 2
    again = _store(path, encoding="int8")
    reread = again.load()
    assert not again.needs_repack and repack(again) is None
    for k, v in vecs.items():
        assert float(np.dot(reread[k], v) / np.linalg.norm(v)) > 0.999
    # Appending to a version-1 file rewrites it as version 2 with everything in it.
    _store(path, encoding="float32")._rewrite(vecs, "float32", version=1)
    extra = _vectors(1, seed=9)
    _store(path, encoding="int8").append({"f" * 32: extra["0" * 32]})
    assert path.read_bytes()[:8] == MAGIC and len(_store(path).load()) == 101


def test_a_rewrite_never_widens_rows_and_float16_rows_round_trip(tmp_path: Path) -> None:
    vecs = _vectors(50)
    path = tmp_path / "v.bin"
    _store(path, encoding="int8").rewrite(vecs)
    int8_size = path.stat().st_size
    wide = _store(path, encoding="float32")  # a daemon set to float32 compacting an int8 file
    assert retain(wide, set(list(vecs)[:40])) == (40, 10)
    assert path.stat().st_size < int8_size and wide.load().keys() == set(list(vecs)[:40])
    assert not wide.needs_narrowing
    half = _store(path, encoding="float16")
    half.rewrite(vecs)
    first = half.load()
    half.rewrite(first)
    assert all(np.array_equal(first[k], v) for k, v in _store(path, encoding="float16").load().items())
    index, _ = _load_index(_store(path, encoding="float16"), {i: k for i, k in enumerate(vecs)}, "float16")
    built = VectorIndex.build(list(range(50)), np.stack(list(vecs.values())), precision="float16")
    assert np.array_equal(index._buf[:50], built._buf[:50])


def test_damage_and_a_wrong_key_discard_the_file(tmp_path: Path) -> None:
    vecs = _vectors(20)
    path = tmp_path / "v.bin"
    _store(path).rewrite(vecs)
    raw = bytearray(path.read_bytes())
    raw[-30] ^= 1
    path.write_bytes(bytes(raw))
    assert _store(path).scan_chunks(lambda c: None) is False and not path.exists()
    _store(path).rewrite(vecs)
    assert _store(path, key=b"x" * 32).load() == {} and not path.exists()


# ---------------------------------------------------------------------------------- the daemon


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return two_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture
def daemon(model_dirs: dict[str, Path]) -> Iterator[Daemon]:
    home = short_tmpdir() / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{model_dirs["a"]}"\n[index]\nbackground = false\n')
    d = Daemon(home, env={"HOME": str(home.parent)}).start()
    yield d
    d.stop()
    shutil.rmtree(home.parent, ignore_errors=True)


def _as_version_1(home: Path, vid: str) -> Path:
    """Rewrite the (locked) vault's sidecar as a version-1 file of the same vectors."""
    store = VaultStore.open(home / "vaults" / vid, passphrase=PASS.encode())
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        [path] = sorted(store.dir.glob("vectors-*.bin"))
        entry = read_spaces(store.dir, vault_id=vid, open_=sealer.open)[sidecar_opaque_id(path)]
        side = VectorStore(path, vault_id=vid, identity=str(entry["identity"]), dims=int(str(entry["dims"])),
                           seal=sealer.seal, open_=sealer.open)
        side._rewrite(side.load(), "float32", version=1)
        return path
    finally:
        sealer.wipe()
        store.close()


def test_the_daemon_reads_a_version_1_sidecar_without_re_embedding_and_rewrites_it_in_int8(daemon: Daemon) -> None:
    vid = create_vault(daemon, passphrase=PASS)
    for title, body in TOPIC_NOTES:
        daemon.call("memory.add", {"vault": vid, "title": title, "body": body})
    assert daemon.call("rag.index", {"vault": vid})["embedded"] == len(TOPIC_NOTES)
    query = {"vault": vid, "query": "puppy vet food", "mode": "vector", "limit": 5}
    before = daemon.call("rag.search", query)["results"]
    daemon.call("vault.lock", {"vault": vid})
    path = _as_version_1(daemon.home, vid)
    v1_size = path.stat().st_size
    daemon.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    after = daemon.call("rag.search", query)["results"]
    assert [r["record_id"] for r in after] == [r["record_id"] for r in before]
    assert all(abs(a["cosine"] - b["cosine"]) < 0.01 for a, b in zip(after, before, strict=True))
    assert daemon.call("rag.index", {"vault": vid})["embedded"] == 0
    deadline = time.monotonic() + 30  # rewritten in the background after the search
    while "rewritten in int8" not in daemon.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "rewritten in int8" in daemon.log_text()
    assert path.read_bytes()[:8] == MAGIC and path.stat().st_size < v1_size


def test_a_file_of_many_small_appended_chunks_is_repacked_into_full_ones(tmp_path: Path) -> None:
    vecs = _vectors(2600)
    keys = list(vecs)
    path = tmp_path / "v.bin"
    store = _store(path)
    for i in range(0, len(keys), 20):  # one append per embedding batch
        store.append({k: vecs[k] for k in keys[i : i + 20]})
    store.append({keys[0]: -vecs[keys[0]]})  # a later duplicate, kept last
    reader = _store(path)
    chunks: list[int] = []
    assert reader.scan_chunks(lambda c: chunks.append(len(c))) is True
    assert len(chunks) == 131 and reader.needs_repack
    before = reader.load()
    assert repack(reader) == 2601 and not reader.needs_repack
    after = _store(path)
    sizes: list[int] = []
    assert after.scan_chunks(lambda c: sizes.append(len(c))) is True
    assert len(sizes) == 2 and sum(sizes) == 2601 and not after.needs_repack
    reread = after.load()
    assert reread.keys() == before.keys() and all(np.array_equal(reread[k], before[k]) for k in before)
    assert float(np.dot(reread[keys[0]], vecs[keys[0]])) < 0
