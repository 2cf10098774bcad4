"""``[index] vector_precision``: float32, float16 and int8 rows in the vector index.

Ranking and scores are compared with float32 on real embeddings (all-MiniLM-L6-v2 over SciFact
abstracts and queries); memory and the cache cap use each representation's real bytes; a real
daemon holds its vectors as configured.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from memoriesd.config import parse_config
from memoriesd.errors import CapExceeded, ConfigError
from memoriesd.index.vectors.matrix import PRECISIONS, VectorIndex, bytes_per_vector, check_vector_cap

from .conftest import SHARED, DaemonError, create_vault, needs_shared, running_daemon

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
#: Largest |score - float32 cosine| accepted per precision. Measured over SciFact's 14,747 MiniLM
#: vectors and 300 queries (top 100 each): at most 5.6e-5 as float16, 1.6e-3 as int8 (mean 2.6e-4).
SCORE_TOLERANCE = {"float32": 1e-6, "float16": 2e-4, "int8": 5e-3}


def _scifact(n_docs: int, n_queries: int) -> tuple[list[tuple[str | None, str]], list[str]]:
    docs, queries = [], []
    with (SHARED / "eval" / "scifact" / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if doc["text"].strip():
                docs.append((doc.get("title") or None, " ".join(doc["text"].split())[:300]))
            if len(docs) == n_docs:
                break
    with (SHARED / "eval" / "scifact" / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            queries.append(json.loads(line)["text"])
            if len(queries) == n_queries:
                break
    return docs, queries


@pytest.fixture(scope="module")
def embedded() -> tuple[np.ndarray, np.ndarray]:
    """(document vectors, query vectors) from the real MiniLM model: 120 abstracts, 24 queries."""
    from memoriesd.embed.local import LocalEmbedder

    if not MINILM.is_dir():  # pragma: no cover - ../shared is beside the repo in CI
        raise AssertionError(needs_shared("models/all-MiniLM-L6-v2-onnx"))
    emb = LocalEmbedder(MINILM, threads=2)
    docs, queries = _scifact(120, 24)
    return np.asarray(emb.embed_documents(docs), np.float32), np.asarray(emb.embed_queries(queries), np.float32)


def _exact(docs: np.ndarray, q: np.ndarray) -> np.ndarray:
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    return unit @ (q / np.linalg.norm(q))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_ranks_real_embeddings_like_float32_within_its_score_tolerance(
    embedded: tuple[np.ndarray, np.ndarray], precision: str
) -> None:
    docs, queries = embedded
    keys = list(range(1000, 1000 + len(docs)))
    index = VectorIndex.build(keys, docs, precision=precision)
    tol = SCORE_TOLERANCE[precision]
    for q in queries:
        exact = _exact(docs, q)
        got = index.search(q, 10)
        assert len(got) == 10
        for key, score in got:
            assert abs(score - exact[key - 1000]) <= tol
        # The same top 10 as float32, except where float32's own scores are closer than the
        # tolerance (a near-tie may swap across the cut).
        cut = np.sort(exact)[::-1][9]
        want = {keys[i] for i in np.flatnonzero(exact > cut + 2 * tol)}
        near = {keys[i] for i in np.flatnonzero(exact >= cut - 2 * tol)}
        assert want <= {k for k, _ in got} <= near
        # score() agrees with search() on the same rows.
        assert index.score(q, [k for k, _ in got]) == pytest.approx([s for _, s in got], abs=1e-6)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_returned_scores_are_float32_cosines_of_the_stored_row(
    embedded: tuple[np.ndarray, np.ndarray], precision: str
) -> None:
    """No second approximation: every score is the float32 cosine of the row ``get`` returns."""
    docs, queries = embedded
    index = VectorIndex.build(list(range(len(docs))), docs, precision=precision)
    for q in queries[:5]:
        unit_q = q / np.linalg.norm(q)
        for key, score in index.search(q, 20):
            row = index.get(key)
            assert row is not None
            assert score == pytest.approx(float(row @ unit_q), abs=2e-6)
            assert float(np.linalg.norm(row)) == pytest.approx(1.0, abs=2e-3)


def test_float16_rows_decode_exactly_subnormals_included() -> None:
    # Components down to ~1e-7 are float16 subnormals after normalizing; decoding must be exact.
    vec = np.array([0.9, -0.4, 1e-5, -3e-6, 2.5e-7, 0.0, 6.1e-5, -0.123], dtype=np.float32)
    index = VectorIndex.build([1], vec[None, :], precision="float16")
    unit = vec / np.linalg.norm(vec)
    np.testing.assert_array_equal(index.get(1), unit.astype(np.float16).astype(np.float32))
    allbits = np.arange(-(1 << 15), 1 << 15, dtype=np.int32).astype(np.int16)
    finite = np.isfinite(allbits.view(np.float16))
    out = np.empty(allbits.shape, np.float32)
    VectorIndex._f16_bits_to_f32(allbits, out)  # every finite half value, via the scoring path
    np.testing.assert_array_equal((out * np.float32(2.0**112))[finite], allbits.view(np.float16)[finite].astype(np.float32))


def test_memory_shrinks_as_documented() -> None:
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((500, 768)).astype(np.float32)
    sizes = {p: VectorIndex.build(list(range(500)), vecs, precision=p).nbytes for p in PRECISIONS}
    assert sizes == {"float32": 500 * 3072, "float16": 500 * 1536, "int8": 500 * 772}
    assert sizes["int8"] / sizes["float32"] < 0.26
    # nbytes is what the buffers really hold for the used rows.
    index = VectorIndex.build(list(range(500)), vecs, precision="int8")
    assert index._buf[: len(index)].nbytes + index._scale[: len(index)].nbytes == index.nbytes
    assert index._buf.dtype == np.int8


def test_removing_and_replacing_rows_keeps_each_key_on_its_own_vector() -> None:
    rng = np.random.default_rng(6)
    vecs = rng.standard_normal((300, 64)).astype(np.float32)
    for precision in ("float16", "int8"):
        index = VectorIndex.build(list(range(300)), vecs, precision=precision)
        index.remove(range(0, 300, 3))
        index.add([1], vecs[2:3])
        for key in index.keys():
            want = vecs[2 if key == 1 else key]
            cos = float(index.get(key) @ (want / np.linalg.norm(want)))  # type: ignore[operator]
            assert cos > 0.999
        assert index.search(vecs[5], 1)[0][0] == 5


def test_the_cap_counts_the_representation_bytes() -> None:
    # 1 MiB holds 1,024 float32 vectors of 256 dims, but 4,032 int8 ones (256 + 4 bytes each).
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((4000, 256)).astype(np.float32)
    with pytest.raises(CapExceeded):
        VectorIndex.build(list(range(4000)), vecs, max_vector_mib=1.0, precision="float32")
    index = VectorIndex.build(list(range(4000)), vecs, max_vector_mib=1.0, precision="int8")
    assert len(index) == 4000 and index.capacity <= (1 << 20) // bytes_per_vector(256, "int8")
    with pytest.raises(CapExceeded) as err:
        index.add(list(range(4000, 4100)), vecs[:100])
    assert "as int8" in err.value.message and "[index] max_vector_mib" in err.value.message
    assert len(index) == 4000
    check_vector_cap(100_000, 768, 74.0, "int8")  # 73.6 MiB
    with pytest.raises(CapExceeded):
        check_vector_cap(100_000, 768, 74.0, "float32")


@pytest.mark.parametrize("value", ['"bfloat16"', '"INT8"', "8"])
def test_a_bad_vector_precision_is_one_line_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(tomllib.loads(f"[index]\nvector_precision = {value}\n"), Path("/tmp"))
    msg = str(err.value)
    assert "index.vector_precision" in msg and "\n" not in msg
    assert "'int8'" in msg or "a string" in msg
    assert parse_config(tomllib.loads('[index]\nvector_precision = "float16"\n'), Path("/tmp")).index.vector_precision == "float16"


def test_the_daemon_holds_vectors_as_configured_and_caps_them_in_those_bytes(tmp_path: Path) -> None:
    """40 MiniLM vectors (384 dims): 61,440 bytes as float32, 15,520 as int8; a 30 KiB cap holds
    them only as int8."""
    if not MINILM.is_dir():  # pragma: no cover
        raise AssertionError(needs_shared("models/all-MiniLM-L6-v2-onnx"))
    docs, queries = _scifact(40, 1)
    cfg = (f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n'
           'max_vector_mib = 0.03\nvector_precision = "{}"\n')
    with running_daemon(cfg.replace("{}", "int8")) as d:
        vid = create_vault(d)
        for title, text in docs:
            d.call("memory.add", {"vault": vid, "title": title or "", "body": text})
        st = d.call("rag.status", {"vault": vid})
        n = st["fragments"]
        out = d.call("rag.index", {"vault": vid})
        assert out["remaining"] == 0
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["embedded"] == n and emb["vector_bytes"] == n * (384 + 4)
        # min_score -1: the query's own documents may not be among these 40, so no floor
        hits = d.call("rag.search", {"vault": vid, "query": queries[0], "mode": "vector", "limit": 5, "min_score": -1})["results"]
        assert len(hits) == 5 and all(-1.0 <= h["score"] <= 1.0 for h in hits)
    with running_daemon(cfg.replace("{}", "float32")) as d:
        vid = create_vault(d)
        for title, text in docs:
            d.call("memory.add", {"vault": vid, "title": title or "", "body": text})
        with pytest.raises(DaemonError) as err:
            d.call("rag.index", {"vault": vid})
        assert err.value.code == "cap_exceeded" and "as float32" in str(err.value) and "max_vector_mib" in str(err.value)
