#!/usr/bin/env python3
"""Memory of the daemon at 100,000 fragments a vault; prints one JSON object.

What the ``[index]`` cache caps are sized from (docs/benchmarks.md, "Memory and the cache caps"):

- lexical: a real daemon (its RSS and peak RSS from /proc/PID/status) while two vaults of
  ``--fragments`` fragments each are built the user's way: Markdown files (tldr pages in English
  and Chinese, then SciFact abstracts repeated under distinct titles) through ``rag ingest``, then
  a first ``rag search`` (builds the lexical index). Bytes a fragment = RSS growth / fragments.
- vectors, per ``vector_precision``: one child process per precision reads a sealed sidecar of
  ``--fragments`` random unit vectors of ``--dims`` (the unlock path: ``VectorStore.load`` + one
  ``VectorIndex.add``) and reports RSS and peak RSS, bytes a vector (nbytes and RSS), and search
  latency (top-100, top-10, top-100 within a 10 % filter). The ratios compare with float32 in the
  same run. Also: the cost of opening one sealed sidecar chunk (what re-scoring candidates from the
  float32 rows on disk would pay per chunk touched).
- models (``--model-dir``, repeatable): a child process loads the embedder, embeds one query and
  one batch of 32 fragments; RSS growth and peak.
- budget: daemon + model + two cached vaults (lexical + vectors), per precision and model,
  against ``--budget-mib`` (1536).

    .venv/bin/python -m bench.bench_memory --model-dir ../shared/models/all-MiniLM-L6-v2-onnx
    .venv/bin/python -m bench.bench_memory --skip-lexical --fragments 100000 --dims 768
    .venv/bin/python -m bench.bench_memory --default-caps   # the two vaults must fit the defaults
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import Conn, launch_daemon  # noqa: E402

SHARED = REPO.parent / "shared"
PASSPHRASE = "bench memory passphrase"
PRECISIONS = ("float32", "float16", "int8")
MIB = 1024 * 1024


def proc_mem(pid: int | str = "self") -> dict[str, float]:
    """VmRSS, VmHWM (peak RSS) and RssFile (file-backed pages, e.g. mapped model weights) of a
    process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssFile"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mib": out["VmRSS"], "hwm_mib": out["VmHWM"], "file_mib": out["RssFile"]}


# -- the daemon: lexical part ------------------------------------------------------------------


def write_notes(folder: Path, target: int) -> dict[str, int]:
    """Markdown notes until they hold ``target`` fragments (counted with the product's splitter)."""
    from memoriesd.text.fragments import split_fragments

    folder.mkdir(parents=True, exist_ok=True)
    stats = {"files": 0, "bytes": 0, "fragments": 0}

    def put(name: str, text: str) -> bool:
        (folder / name).write_text(text, encoding="utf-8")
        stats["files"] += 1
        stats["bytes"] += len(text.encode("utf-8"))
        stats["fragments"] += max(1, len(split_fragments("x", 1, text, b"k" * 32)))
        return stats["fragments"] >= target

    with tarfile.open(SHARED / "eval" / "tldr.tar.gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 4 and parts[1] in ("pages", "pages.zh") and parts[3].endswith(".md"):
                fh = tar.extractfile(member)
                if fh is not None and put(f"tldr-{parts[1]}-{parts[2]}-{parts[3]}", fh.read().decode("utf-8")):
                    return stats
    docs = [json.loads(line) for line in (SHARED / "eval" / "scifact" / "corpus.jsonl").open(encoding="utf-8")]
    copy = 0
    while True:
        copy += 1
        for doc in docs:
            title = " ".join((doc.get("title") or "").split())
            if put(f"scifact-{copy}-{doc['_id']}.md", f"# {title} ({copy})\n\n{doc['text']}\n"):
                return stats


def start_daemon(home: Path, default_caps: bool) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = "[daemon]\nauto_lock_minutes = 0\n[rag]\noperation_budget_seconds = 3600\nbackground_index = false\n"
    if not default_caps:
        cfg += "[rag.cache]\nmax_fragments = 10000000\nmax_source_mib = 65536\nmax_vector_mib = 65536\n"
    (home / "config.toml").write_text(cfg)
    return launch_daemon(home)


def bench_lexical(fragments: int, vaults: int, default_caps: bool, work: Path) -> dict[str, Any]:
    notes = work / "notes"
    corpus = write_notes(notes, fragments)
    proc = start_daemon(work / "home", default_caps)
    steps: dict[str, dict[str, float]] = {}
    out: dict[str, Any] = {"corpus": corpus, "vaults": []}
    try:
        conn = Conn(work / "home" / "run" / "memoriesd.sock")
        steps["daemon_started"] = proc_mem(proc.pid)
        for v in range(vaults):
            vid = conn.call("vault.create", {"name": f"bench{v}", "passphrase": PASSPHRASE})["vault_id"]
            steps[f"vault{v + 1}_created"] = proc_mem(proc.pid)
            t0 = time.perf_counter()
            report = conn.call("rag.ingest", {"vault": vid, "paths": [str(notes)], "recursive": True})
            ingest_s = time.perf_counter() - t0
            steps[f"vault{v + 1}_ingested"] = proc_mem(proc.pid)
            t0 = time.perf_counter()
            conn.call("rag.search", {"vault": vid, "query": "memory cache", "mode": "bm25", "limit": 10})
            first_s = time.perf_counter() - t0
            steps[f"vault{v + 1}_indexed"] = proc_mem(proc.pid)
            lat = []
            for q in ("protein folding", "git commit", "压缩 文件", "tumor cells immune response", "list files"):
                t0 = time.perf_counter()
                conn.call("rag.search", {"vault": vid, "query": q, "mode": "bm25", "limit": 10})
                lat.append((time.perf_counter() - t0) * 1000)
            st = conn.call("rag.status", {"vault": vid})
            out["vaults"].append({
                "fragments": st["fragments"], "source_bytes": st["cache"]["source_bytes"],
                "records": st["documents"], "refused": len(report.get("refused", [])),
                "ingest_seconds": round(ingest_s, 2), "ingest_mb_per_s": round(corpus["bytes"] / 1e6 / ingest_s, 2),
                "first_search_seconds": round(first_s, 2), "bm25_p50_ms": round(statistics.median(lat), 1),
            })
        for item in conn.call("vault.list", {})["vaults"]:
            conn.call("vault.lock", {"vault": item["vault_id"]})
        time.sleep(0.5)
        steps["all_locked"] = proc_mem(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out["steps"] = steps
    base = steps["daemon_started"]["rss_mib"]
    per_vault = []
    for v, info in enumerate(out["vaults"], 1):
        before = steps[f"vault{v}_created"]["rss_mib"]
        after = steps[f"vault{v}_indexed"]["rss_mib"]
        per_vault.append(round((after - before) * MIB / info["fragments"]))
    out["daemon_base_mib"] = base
    out["bytes_per_fragment"] = per_vault  # records + fragments + FTS5 index, per vault
    out["source_bytes_per_fragment"] = round(out["vaults"][0]["source_bytes"] / out["vaults"][0]["fragments"])
    return out


# -- vectors: one child process per precision --------------------------------------------------


def make_sidecar(path: Path, n: int, dims: int, key: bytes) -> float:
    """A sealed sidecar of ``n`` random unit vectors (written once, reused by every child)."""
    import numpy as np

    from memoriesd.index.vectors.sidecar import VectorStore
    from memoriesd.vault import crypto

    rng = np.random.default_rng(7)
    sealer = crypto.Sealer(key, crypto.LABEL_VECTORS)
    store = VectorStore(path, vault_id="bench", identity="bench-model", dims=dims, seal=sealer.seal, open_=sealer.open)
    vecs = rng.standard_normal((n, dims), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    t0 = time.perf_counter()
    store.rewrite({f"{i:032x}": vecs[i] for i in range(n)})
    return time.perf_counter() - t0


def vector_child(path: Path, dims: int, key: bytes, precision: str, default_heap: bool) -> dict[str, Any]:
    import numpy as np

    from memoriesd.index.vectors.matrix import VectorIndex
    from memoriesd.index.vectors.sidecar import VectorStore
    from memoriesd.vault import crypto

    if not default_heap:
        from memoriesd.workers.process import bound_heap

        bound_heap()  # as the daemon does at start
    sealer = crypto.Sealer(key, crypto.LABEL_VECTORS)
    store = VectorStore(path, vault_id="bench", identity="bench-model", dims=dims, seal=sealer.seal, open_=sealer.open)
    rng = np.random.default_rng(11)
    queries = rng.standard_normal((40, dims)).astype(np.float32)
    base = proc_mem()
    t0 = time.perf_counter()
    loaded = store.load()
    load_s = time.perf_counter() - t0
    n = len(loaded)
    index = VectorIndex(dims, precision=precision)
    t0 = time.perf_counter()
    index.add(list(range(n)), list(loaded.values()))
    add_s = time.perf_counter() - t0
    del loaded
    steady = proc_mem()
    out: dict[str, Any] = {
        "vectors": n,
        "load_seconds": round(load_s, 2),
        "add_seconds": round(add_s, 2),
        "nbytes_mib": round(index.nbytes / MIB, 1),
        "nbytes_per_vector": index.nbytes // n,
        "rss_growth_mib": round(steady["rss_mib"] - base["rss_mib"], 1),
        "rss_bytes_per_vector": round((steady["rss_mib"] - base["rss_mib"]) * MIB / n),
        "peak_growth_mib": round(steady["hwm_mib"] - base["rss_mib"], 1),
    }
    allowed = set(range(0, n, 10))
    for name, kwargs in (("top100", {"k": 100}), ("top10", {"k": 10}), ("top100_filter10pct", {"k": 100, "allowed": allowed})):
        index.search(queries[0], **kwargs)  # type: ignore[arg-type]
        lat = []
        for q in queries:
            t0 = time.perf_counter()
            index.search(q, **kwargs)  # type: ignore[arg-type]
            lat.append((time.perf_counter() - t0) * 1000)
        lat.sort()
        out[f"search_{name}_p50_ms"] = round(lat[len(lat) // 2], 2)
        out[f"search_{name}_p95_ms"] = round(lat[int(len(lat) * 0.95) - 1], 2)
    if precision == "float32":
        out["chunk_open_ms"] = chunk_open_ms(path, store)
    return out


def chunk_open_ms(path: Path, store: Any) -> float:
    """Median time to read, authenticate, decrypt and decode one sealed chunk of the sidecar (2,048
    vectors): the price per chunk of re-scoring candidates from the float32 rows on disk."""
    import struct

    from memoriesd.index.vectors.sidecar import HEADER_SIZE

    raw = path.read_bytes()
    (length,) = struct.unpack_from(">I", raw, HEADER_SIZE)
    blob = raw[HEADER_SIZE + 4 : HEADER_SIZE + 4 + length]
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        store._decode_chunk(store._open(blob, store._chunk_aad(0)), {})
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def bench_vectors(n: int, dims: int, work: Path) -> dict[str, Any]:
    key = secrets.token_bytes(32)
    path = work / "vectors-benchbenchbench.bin"
    seal_s = make_sidecar(path, n, dims, key)
    out: dict[str, Any] = {"rows": n, "dims": dims, "sidecar_bytes": path.stat().st_size, "seal_seconds": round(seal_s, 1)}
    for precision in (*PRECISIONS, "int8/default-heap"):
        name, _, heap = precision.partition("/")
        res = subprocess.run([sys.executable, __file__, "--_vector-child", name, "--dims", str(dims), str(path),
                              *(["--_default-heap"] if heap else [])],
                             input=key.hex(), capture_output=True, text=True, check=True, cwd=str(REPO))
        out[precision] = json.loads(res.stdout)
    f32 = out["float32"]
    for precision in PRECISIONS:
        r = out[precision]
        r["memory_ratio_vs_float32"] = round(r["nbytes_per_vector"] / f32["nbytes_per_vector"], 3)
        r["top100_latency_ratio_vs_float32"] = round(r["search_top100_p50_ms"] / f32["search_top100_p50_ms"], 2)
    path.unlink()
    return out


# -- models --------------------------------------------------------------------------------------


def model_child(model_dir: str) -> dict[str, Any]:
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import numpy  # noqa: F401  (imported by the daemon before any model)
    import onnxruntime  # noqa: F401

    from memoriesd.embed.local import LocalEmbedder
    from memoriesd.workers.process import bound_heap

    bound_heap()  # as the daemon does at start
    base = proc_mem()
    t0 = time.perf_counter()
    emb = LocalEmbedder(Path(model_dir), threads=2)
    load_s = time.perf_counter() - t0
    loaded = proc_mem()
    emb.embed_queries(["which proteins bind to the receptor"])
    text = "Memories keeps every note sealed at rest. " * 18
    emb.embed_documents([(f"note {i}", text) for i in range(32)])
    used = proc_mem()
    return {
        "model_dir": model_dir, "dimensions": emb.dimensions, "load_seconds": round(load_s, 1),
        "rss_growth_loaded_mib": round(loaded["rss_mib"] - base["rss_mib"], 1),
        "rss_growth_after_batch_mib": round(used["rss_mib"] - base["rss_mib"], 1),
        "file_backed_growth_mib": round(used["file_mib"] - base["file_mib"], 1),
        "peak_growth_mib": round(used["hwm_mib"] - base["rss_mib"], 1),
        "weights_mib": round(sum(p.stat().st_size for p in Path(model_dir).rglob("*") if p.is_file()) / MIB, 1),
    }


def bench_models(model_dirs: list[str]) -> list[dict[str, Any]]:
    out = []
    for d in model_dirs:
        res = subprocess.run([sys.executable, __file__, "--_model-child", d], capture_output=True, text=True,
                             check=True, cwd=str(REPO))
        out.append(json.loads(res.stdout))
    return out


def budget(result: dict[str, Any], vaults: int, budget_mib: float) -> dict[str, Any]:
    lex = result.get("lexical")
    vec = result.get("vectors")
    if not lex or not vec:
        return {}
    base = lex["daemon_base_mib"]
    lexical = sum(v * f["fragments"] for v, f in zip(lex["bytes_per_fragment"], lex["vaults"], strict=True)) / MIB
    frags = lex["vaults"][0]["fragments"]
    out: dict[str, Any] = {"budget_mib": budget_mib, "daemon_base_mib": base, "lexical_mib": round(lexical, 1)}
    models = [m for m in result.get("models") or [] if m["dimensions"] == vec["dims"]]  # vectors of that width
    for precision in PRECISIONS:
        per_vector = vec[precision]["rss_bytes_per_vector"]
        vectors = vaults * frags * per_vector / MIB
        row: dict[str, Any] = {"vectors_mib": round(vectors, 1)}
        for m in models:
            total = base + lexical + vectors + m["rss_growth_after_batch_mib"]
            row[Path(m["model_dir"]).name] = {"total_mib": round(total, 1), "fits": total <= budget_mib}
        out[precision] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fragments", type=int, default=100_000, help="fragments a vault (and vectors a sidecar)")
    ap.add_argument("--dims", type=int, default=768)
    ap.add_argument("--vaults", type=int, default=2)
    ap.add_argument("--model-dir", action="append", default=[], help="a local embedding model to load (repeatable)")
    ap.add_argument("--skip-lexical", action="store_true")
    ap.add_argument("--skip-vectors", action="store_true")
    ap.add_argument("--default-caps", action="store_true", help="run the daemon with the default [rag.cache] caps")
    ap.add_argument("--budget-mib", type=float, default=1536.0)
    ap.add_argument("--_vector-child", dest="vector_child", help=argparse.SUPPRESS)
    ap.add_argument("--_model-child", dest="model_child", help=argparse.SUPPRESS)
    ap.add_argument("--_default-heap", dest="default_heap", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("sidecar", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vector_child:
        key = bytes.fromhex(sys.stdin.read().strip())
        print(json.dumps(vector_child(Path(args.sidecar), args.dims, key, args.vector_child, args.default_heap)))
        return
    if args.model_child:
        print(json.dumps(model_child(args.model_child)))
        return
    result: dict[str, Any] = {"cpus": os.cpu_count(), "fragments_per_vault": args.fragments}
    with tempfile.TemporaryDirectory(prefix="membench", dir="/tmp") as tmp:
        work = Path(tmp)
        if not args.skip_lexical:
            result["lexical"] = bench_lexical(args.fragments, args.vaults, args.default_caps, work)
        if not args.skip_vectors:
            result["vectors"] = bench_vectors(args.fragments, args.dims, work)
    if args.model_dir:
        result["models"] = bench_models(args.model_dir)
    result["budget"] = budget(result, args.vaults, args.budget_mib)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
