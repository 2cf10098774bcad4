#!/usr/bin/env python3
"""The query-vector cache: what a repeated query costs with and without it; prints one JSON object.

A daemon on a temp home with a local model (``--model-dir``; default the small all-MiniLM-L6-v2 in
../shared), a vault filled through ``memories rag ingest`` of Markdown files, then for each of
``--queries`` distinct queries: a first vector search (a miss: the query is embedded) and
``--repeats`` repeats (hits), read from the daemon's own ``timings_ms.query_embed_ms`` of
``rag.search`` (the part of a search the cache replaces). Both sides run in the same daemon, query
after query, so a busy machine slows both alike. ``ratio`` = miss / hit (median). Also the cost of
one ``QueryCache.get`` hit in this process over ``--micro`` calls (1,000 entries held).

Usage: .venv/bin/python -m bench.bench_query_cache [--model-dir DIR] [--queries 20] [--repeats 5]
"""

from __future__ import annotations

import os

os.environ["ORT_DISABLE_TELEMETRY"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

from memoriesd.embed.query_cache import QueryCache  # noqa: E402
from tests.conftest import Daemon, cli_json, create_vault, write_config  # noqa: E402

TOPICS = ["tea", "mountains", "piano", "taxes", "gardening", "sailing", "bread", "chess", "trains", "birds"]


def micro(calls: int) -> dict[str, float]:
    cache = QueryCache(1000, 300)
    keys = [("v", "identity", "prompt", f"query number {i}") for i in range(1000)]
    for k in keys:
        cache.put(k, np.random.default_rng(0).standard_normal(768).astype(np.float32))
    t0 = time.perf_counter()
    for i in range(calls):
        cache.get(keys[i % 1000])
    per = (time.perf_counter() - t0) / calls
    return {"calls": calls, "hit_us": round(per * 1e6, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, default=REPO.parent / "shared" / "models" / "all-MiniLM-L6-v2-onnx")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--micro", type=int, default=100_000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bq", dir="/tmp"))
    home = root / "h"
    write_config(home, f'[rag]\nlocal_model_dir = "{args.model_dir}"\nlocal_threads = 2\nbackground_index = false\n')
    notes = root / "notes"
    notes.mkdir()
    for i, topic in enumerate(TOPICS):
        (notes / f"{topic}.md").write_text(f"# {topic.title()}\n\nNotes about {topic}, number {i}: what I learned, what to try next.\n")
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        cli_json(home, "rag", "ingest", vid, str(notes), "--recursive")
        d.call("rag.index", {"vault": vid})
        miss: list[float] = []
        hit: list[float] = []
        for q in range(args.queries):
            query = f"what did I note about {TOPICS[q % len(TOPICS)]} ({q})"
            miss.append(d.call("rag.search", {"vault": vid, "query": query, "mode": "vector"})["timings_ms"]["query_embed_ms"])
            for _ in range(args.repeats):
                hit.append(d.call("rag.search", {"vault": vid, "query": query, "mode": "vector"})["timings_ms"]["query_embed_ms"])
        out = {
            "model": args.model_dir.name,
            "queries": args.queries,
            "repeats": args.repeats,
            "miss_ms_median": round(statistics.median(miss), 4),
            "hit_ms_median": round(statistics.median(hit), 4),
            "hit_ms_max": round(max(hit), 4),
            "ratio": round(statistics.median(miss) / max(statistics.median(hit), 1e-6), 1),
            "micro": micro(args.micro),
        }
        print(json.dumps(out, indent=1))
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
