#!/usr/bin/env python3
"""Benchmark the local embedder and the vector index; prints one JSON object.

- documents: SciFact abstracts cut into 768-character fragments (128 overlap), embedded as
  ``(title, fragment)`` with length-bucketed batches and with naive fixed batches in input
  order, in the same run (fragments/s, tokens/s, padding, ratio, and that both agree);
- queries: single-query embedding latency p50/p95 (SciFact queries);
- search: exact top-100 cosine over 10,000 x 768 random unit vectors, with and without a filter.

Usage: .venv/bin/python scripts/bench_embed.py [--model-dir DIR] [--limit 1000] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memoriesd.embed.local import LocalEmbedder, fixed_batches, plan_batches  # noqa: E402
from memoriesd.embed.profile import format_document  # noqa: E402
from memoriesd.index.vectors import VectorIndex  # noqa: E402
from memoriesd.text.fragments import split_fragments  # noqa: E402

SHARED = REPO.parent / "shared"


def fragments(text: str) -> list[str]:
    """The product's own 768/128 fragments of one text (any fixed key: fingerprints are unused here)."""
    return [f.text for f in split_fragments("bench", 1, text, b"bench-embed") if f.text]


def load_items(corpus: Path, limit: int) -> list[tuple[str | None, str]]:
    items: list[tuple[str | None, str]] = []
    with corpus.open(encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            for frag in fragments(doc["text"]):
                items.append((doc.get("title") or None, frag))
                if len(items) >= limit:
                    return items
    return items


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def padded_tokens(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=SHARED / "models" / "all-MiniLM-L6-v2-onnx")
    ap.add_argument("--corpus", type=Path, default=SHARED / "eval" / "scifact" / "corpus.jsonl")
    ap.add_argument("--queries", type=Path, default=SHARED / "eval" / "scifact" / "queries.jsonl")
    ap.add_argument("--limit", type=int, default=1000, help="fragments to embed")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--naive-batch", type=int, default=32)
    ap.add_argument("--query-count", type=int, default=50)
    args = ap.parse_args()

    t0 = time.perf_counter()
    emb = LocalEmbedder(args.model_dir, threads=args.threads)
    load_s = time.perf_counter() - t0
    items = load_items(args.corpus, args.limit)
    texts = [format_document(emb.profile, t, f) for t, f in items]
    lengths = [len(s) for s in emb._encode(texts)]  # tokens the model reads
    real_tokens = sum(lengths)
    emb.embed_documents(items[:16])  # warm-up

    # Naive: fixed batches in input order (benchmark-only path through the private runner).
    naive_plan = fixed_batches(len(texts), args.naive_batch)
    t0 = time.perf_counter()
    naive = emb._embed_texts(texts, lambda _lengths: naive_plan)
    naive_s = time.perf_counter() - t0

    bucket_plan = plan_batches(lengths, args.batch_tokens)
    t0 = time.perf_counter()
    bucketed = emb.embed_documents(items, batch_tokens=args.batch_tokens)
    bucket_s = time.perf_counter() - t0
    agreement = float(np.min(np.sum(naive * bucketed, axis=1)))

    queries: list[str] = []
    if args.queries.is_file():
        with args.queries.open(encoding="utf-8") as fh:
            queries = [json.loads(line)["text"] for _, line in zip(range(args.query_count), fh, strict=False)]
    queries = queries or ["what is the effect of a drug on blood pressure"] * args.query_count
    emb.embed_queries(queries[:2])
    q_ms = []
    for q in queries:
        t0 = time.perf_counter()
        emb.embed_queries([q])
        q_ms.append((time.perf_counter() - t0) * 1000)

    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((10_000, 768)).astype(np.float32)
    index = VectorIndex.build(list(range(10_000)), matrix)
    probes = rng.standard_normal((200, 768)).astype(np.float32)
    allowed = set(range(0, 10_000, 10))
    s_ms, f_ms = [], []
    for p in probes:
        t0 = time.perf_counter()
        index.search(p, 100)
        s_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        index.search(p, 100, allowed=allowed)
        f_ms.append((time.perf_counter() - t0) * 1000)

    print(json.dumps({
        "model_dir": str(args.model_dir),
        "identity": emb.identity[:16],
        "dimensions": emb.dimensions,
        "max_tokens": emb.max_tokens,
        "threads": min(args.threads, os.cpu_count() or 1),
        "load_seconds": round(load_s, 3),
        "fragments": len(items),
        "tokens": real_tokens,
        "mean_tokens_per_fragment": round(real_tokens / max(1, len(items)), 1),
        "bucketed": {
            "seconds": round(bucket_s, 3),
            "fragments_per_s": round(len(items) / bucket_s, 1),
            "tokens_per_s": round(real_tokens / bucket_s, 1),
            "batches": len(bucket_plan),
            "padded_tokens": padded_tokens(lengths, bucket_plan),
        },
        "naive": {
            "seconds": round(naive_s, 3),
            "batch_size": args.naive_batch,
            "fragments_per_s": round(len(items) / naive_s, 1),
            "tokens_per_s": round(real_tokens / naive_s, 1),
            "batches": len(naive_plan),
            "padded_tokens": padded_tokens(lengths, naive_plan),
        },
        "speedup_bucketed_vs_naive": round(naive_s / bucket_s, 2),
        "min_cosine_bucketed_vs_naive": round(agreement, 6),
        "query_latency_ms": {"n": len(q_ms), "p50": round(statistics.median(q_ms), 2), "p95": round(pct(q_ms, 95), 2)},
        "vector_search_10000x768_top100_ms": {
            "p50": round(statistics.median(s_ms), 3),
            "p95": round(pct(s_ms, 95), 3),
            "filtered_1000_p50": round(statistics.median(f_ms), 3),
        },
    }, indent=2))


if __name__ == "__main__":
    main()
