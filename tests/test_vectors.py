"""VectorIndex (exact cosine top-k) and VectorStore (sealed, append-only vector sidecars)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from memoriesd.errors import CapExceeded
from memoriesd.index.vectors.matrix import VectorIndex, check_vector_cap
from memoriesd.index.vectors.names import entry_key, list_sidecars, sidecar_path
from memoriesd.index.vectors.sidecar import HEADER_SIZE, VectorStore

# ---------------------------------------------------------------------------------------------
# A real authenticated seal built from the standard library (SHAKE-256 keystream + HMAC-SHA256),
# standing in for the vault's AEAD: any change to blob or aad makes open raise.
# ---------------------------------------------------------------------------------------------


class StdlibSeal:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def _stream(self, nonce: bytes, n: int) -> np.ndarray:
        return np.frombuffer(hashlib.shake_256(self.key + nonce).digest(n), dtype=np.uint8)

    def _tag(self, nonce: bytes, ct: bytes, aad: bytes) -> bytes:
        return hmac.new(self.key, nonce + len(aad).to_bytes(8, "big") + aad + ct, hashlib.sha256).digest()

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(16)
        ct = (np.frombuffer(plaintext, dtype=np.uint8) ^ self._stream(nonce, len(plaintext))).tobytes()
        return nonce + ct + self._tag(nonce, ct, aad)

    def open(self, blob: bytes, aad: bytes) -> bytes:
        nonce, ct, tag = blob[:16], blob[16:-32], blob[-32:]
        if len(blob) < 48 or not hmac.compare_digest(tag, self._tag(nonce, ct, aad)):
            raise ValueError("authentication failed")
        return (np.frombuffer(ct, dtype=np.uint8) ^ self._stream(nonce, len(ct))).tobytes()


DIMS = 24
KEY = b"k" * 32


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    m = rng.standard_normal((n, d)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def make_entries(n: int, seed: int = 0, prefix: str = "fp") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    vecs = unit_rows(rng, n, DIMS)
    return {entry_key(f"{prefix}{i:05d}", f"title {i % 7}"): vecs[i] for i in range(n)}


def store(path: Path, *, vault_id: str = "vault-1", identity: str = "model-a", dims: int = DIMS,
          key: bytes = KEY) -> VectorStore:
    s = StdlibSeal(key)
    return VectorStore(path, vault_id=vault_id, identity=identity, dims=dims, seal=s.seal, open_=s.open)


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


# ---------------------------------------------------------------------------------------------
# VectorIndex
# ---------------------------------------------------------------------------------------------


def brute_force(matrix: np.ndarray, keys: list[int], q: np.ndarray, k: int, rows: list[int] | None = None):
    q = q / np.linalg.norm(q)
    cand = range(len(keys)) if rows is None else rows
    scored = sorted(((float(matrix[r] @ q), keys[r]) for r in cand), key=lambda t: (-t[0], t[1]))
    return [(key, s) for s, key in scored[:k]]


def test_top_k_matches_brute_force_ranking_and_scores() -> None:
    rng = np.random.default_rng(1)
    vecs = unit_rows(rng, 3000, 64)
    keys = [int(k) for k in rng.permutation(100_000)[:3000]]
    index = VectorIndex.build(keys, vecs)
    for _ in range(5):
        q = rng.standard_normal(64).astype(np.float32)
        got = index.search(q, 10)
        want = brute_force(vecs, keys, q, 10)
        assert [g[0] for g in got] == [w[0] for w in want]
        np.testing.assert_allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-5, atol=1e-6)
    assert index.nbytes == 3000 * 64 * 4
    assert index.matrix.flags["C_CONTIGUOUS"]


def test_allowed_filter_only_returns_allowed_keys_small_and_large_subsets() -> None:
    rng = np.random.default_rng(2)
    vecs = unit_rows(rng, 1000, 32)
    keys = list(range(1000, 2000))
    index = VectorIndex.build(keys, vecs)
    q = rng.standard_normal(32).astype(np.float32)
    for size in (5, 100, 900):
        allowed = {int(k) for k in rng.choice(keys, size=size, replace=False)} | {99_999}  # one unknown key
        got = index.search(q, 20, allowed=allowed)
        want = brute_force(vecs, keys, q, 20, rows=[k - 1000 for k in allowed if k != 99_999])
        assert [g[0] for g in got] == [w[0] for w in want]
        assert all(g[0] in allowed for g in got)
    assert index.search(q, 5, allowed=[]) == []
    assert index.search(q, 5, allowed={123}) == []


def test_min_score_drops_weak_matches_and_k_larger_than_index_returns_all_sorted() -> None:
    vecs = np.array([[1, 0, 0], [0.8, 0.6, 0], [0, 1, 0], [-1, 0, 0]], dtype=np.float32)
    index = VectorIndex.build([10, 11, 12, 13], vecs)
    q = np.array([1, 0, 0], dtype=np.float32)
    assert [k for k, _ in index.search(q, 10)] == [10, 11, 12, 13]
    got = index.search(q, 10, min_score=0.5)
    assert [k for k, _ in got] == [10, 11]
    assert got[1][1] == pytest.approx(0.8, abs=1e-6)
    assert index.search(q, 10, min_score=1.5) == []
    assert index.search(q, 10, allowed={11, 12, 13}, min_score=0.0) == [(11, pytest.approx(0.8)), (12, 0.0)]
    assert index.search(np.zeros(3, np.float32), 3) == []
    assert index.search(q, 0) == []


def test_add_replaces_and_remove_keeps_rows_consistent() -> None:
    rng = np.random.default_rng(3)
    index = VectorIndex(16)
    vecs = unit_rows(rng, 200, 16)
    index.add(list(range(200)), vecs * 3.0)  # normalized on the way in
    np.testing.assert_allclose(np.linalg.norm(index.matrix, axis=1), 1.0, rtol=1e-6)
    assert index.remove([0, 5, 199, 12345]) == 3
    assert len(index) == 197 and 5 not in index and 6 in index
    new = unit_rows(rng, 1, 16)
    index.add([6], new)
    np.testing.assert_allclose(index.get(6), new[0], rtol=1e-6)
    assert index.search(new[0], 1)[0][0] == 6
    # Every surviving key still maps to its own vector after the swaps.
    for k in index.keys():
        if k != 6:
            np.testing.assert_allclose(index.get(k), vecs[k], rtol=1e-5, atol=1e-6)
    assert index.score(new[0], [6, 5]) == [pytest.approx(1.0), None]


def test_vector_cap_names_the_cap_the_size_and_the_config_key() -> None:
    with pytest.raises(CapExceeded) as err:
        check_vector_cap(12_000, 768, 32.0)
    msg = err.value.message
    assert "35.2 MiB" in msg and "32 MiB" in msg and "[index] max_vector_mib" in msg
    assert err.value.code == "cap_exceeded"
    check_vector_cap(10_000, 768, 32.0)  # 29.3 MiB fits


def test_index_with_cap_refuses_an_add_and_stays_unchanged() -> None:
    index = VectorIndex(256, max_vector_mib=1.0)  # 1024 vectors of 256 dims
    rng = np.random.default_rng(4)
    index.add(list(range(1000)), unit_rows(rng, 1000, 256))
    with pytest.raises(CapExceeded):
        index.add(list(range(1000, 1100)), unit_rows(rng, 100, 256))
    assert len(index) == 1000
    index.add(list(range(0, 100)), unit_rows(rng, 100, 256))  # replacing existing keys does not grow
    assert len(index) == 1000


# ---------------------------------------------------------------------------------------------
# VectorStore
# ---------------------------------------------------------------------------------------------


def test_sealed_sidecar_round_trips_and_leaks_nothing_in_plaintext(tmp_path: Path) -> None:
    path = sidecar_path(tmp_path, "a1b2c3d4e5f6")
    entries = make_entries(300)
    store(path).rewrite(entries)
    assert_same(store(path).load(), entries)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    for needle in (b"fp00001", b"model-a", b"vault-1", b"title", next(iter(entries.values())).tobytes()[:16]):
        assert needle not in raw
    assert list_sidecars(tmp_path) == [path]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_appends_are_incremental_and_survive_reload(tmp_path: Path) -> None:
    path = tmp_path / "vectors-0123456789.bin"
    first, second = make_entries(50, seed=1, prefix="a"), make_entries(3000, seed=2, prefix="b")
    s = store(path)
    assert s.load() == {}
    s.append(first)
    before = path.read_bytes()
    s.append(second)  # more than one chunk
    after = path.read_bytes()
    assert after[HEADER_SIZE : len(before)] == before[HEADER_SIZE:]  # appended, not rewritten
    assert len(after) > len(before) + 2 * 2048 * DIMS * 4
    replaced = {next(iter(first)): np.full(DIMS, 1 / np.sqrt(DIMS), dtype=np.float32)}
    store(path).append(replaced)  # a fresh instance appends too (it reads the commit first)
    loaded = store(path).load()
    assert len(loaded) == 3050
    np.testing.assert_array_equal(loaded[next(iter(first))], replaced[next(iter(first))])


def test_rewrite_compacts_to_exactly_the_given_entries(tmp_path: Path) -> None:
    path = tmp_path / "vectors-compacted.bin"
    s = store(path)
    for i in range(5):
        s.append(make_entries(200, seed=i, prefix=f"r{i}-"))
    big = path.stat().st_size
    keep = make_entries(100, seed=9, prefix="k")
    s.rewrite(keep)
    assert path.stat().st_size < big / 5
    assert_same(store(path).load(), keep)
    s.append(make_entries(1, seed=10, prefix="z"))
    assert len(store(path).load()) == 101


@pytest.mark.parametrize("where", ["chunk", "commit", "magic"])
def test_a_flipped_byte_discards_the_file_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    path = tmp_path / "vectors-flipped01.bin"
    store(path).rewrite(make_entries(40))
    raw = bytearray(path.read_bytes())
    offset = {"chunk": len(raw) - 100, "commit": 8 + 20, "magic": 2}[where]
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        assert store(path).load() == {}
    assert any(r.levelno == logging.WARNING and r.name == "memoriesd.vectors" for r in caplog.records)
    assert not path.exists()


@pytest.mark.parametrize(
    "other",
    [{"identity": "model-b"}, {"vault_id": "vault-2"}, {"dims": DIMS + 1}, {"key": b"x" * 32}],
    ids=["identity", "vault", "dims", "key"],
)
def test_a_sidecar_of_another_model_or_vault_loads_as_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, other: dict
) -> None:
    path = tmp_path / "vectors-foreign01.bin"
    store(path).rewrite(make_entries(10))
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        assert store(path, **other).load() == {}
    assert "damaged" in caplog.text and "fp0" not in caplog.text


@pytest.mark.parametrize("cut", [1, 200, "last-chunk"])
def test_a_truncated_sidecar_loads_as_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture, cut) -> None:
    path = tmp_path / "vectors-truncated.bin"
    s = store(path)
    s.append(make_entries(30, seed=1, prefix="a"))
    boundary = path.stat().st_size
    s.append(make_entries(30, seed=2, prefix="b"))
    raw = path.read_bytes()
    raw = raw[:boundary] if cut == "last-chunk" else raw[: -int(cut)]
    path.write_bytes(raw)
    with caplog.at_level(logging.WARNING, logger="memoriesd.vectors"):
        assert store(path).load() == {}
    assert "damaged" in caplog.text


def test_an_interrupted_append_keeps_every_committed_vector(tmp_path: Path) -> None:
    path = tmp_path / "vectors-crashed0.bin"
    committed = make_entries(60)
    store(path).rewrite(committed)
    with open(path, "ab") as fh:  # what a crash after writing half a chunk, before the commit, leaves
        fh.write(os.urandom(777))
    assert_same(store(path).load(), committed)
    s = store(path)
    s.load()
    more = make_entries(5, seed=3, prefix="m")
    s.append(more)  # drops the uncommitted tail first
    assert len(store(path).load()) == 65


def test_a_damaged_latest_commit_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "vectors-tornslot.bin"
    s = store(path)
    first = make_entries(20, seed=1, prefix="a")
    s.rewrite(first)  # commit in slot 0
    s.append(make_entries(20, seed=2, prefix="b"))  # commit in slot 1
    raw = bytearray(path.read_bytes())
    raw[8 + 256 + 30] ^= 0xFF  # a torn write of slot 1
    path.write_bytes(bytes(raw))
    assert_same(store(path).load(), first)


def test_chunks_spliced_from_another_file_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "vectors-aaaaaaaa.bin", tmp_path / "vectors-bbbbbbbb.bin"
    store(a).rewrite(make_entries(10, seed=1))
    store(b).rewrite(make_entries(10, seed=2))
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_a[:HEADER_SIZE] + raw_b[HEADER_SIZE:])  # same vault, model, key, lengths
    assert store(a).load() == {}


def test_entry_keys_bind_the_title_and_sidecar_names_stay_opaque(tmp_path: Path) -> None:
    assert entry_key("abc", "One") != entry_key("abc", "Two")
    assert entry_key("abc", None) == entry_key("abc", "")
    assert entry_key("abc", "One") == entry_key("abc", "One")
    assert entry_key("abc", "One").startswith("abc.")
    for bad in ("../../etc", "short", "a/b/c/d/e", "x" * 200):
        with pytest.raises(ValueError):
            sidecar_path(tmp_path, bad)


def test_a_failed_write_is_one_line_error_with_its_own_code(tmp_path: Path) -> None:
    from memoriesd.errors import MemoriesError

    s = store(tmp_path / "missing-dir" / "vectors-nowhere01.bin")
    with pytest.raises(MemoriesError) as err:
        s.append(make_entries(3))
    assert err.value.code == "vector_store_failed"
    assert "\n" not in err.value.message and "vectors-nowhere01.bin" in err.value.message
    assert s.load() == {}
