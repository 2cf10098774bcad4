#!/usr/bin/env python3
"""Time to the first vector search after unlock: sealed vectors reloaded vs re-embedding.

Builds a vault of --fragments one-fragment records (SciFact abstracts cut to 700 characters),
embeds them with a local model (the re-embedding cost, measured), locks, unlocks and times the
first vector search (sealed vectors reload). Prints one JSON object with the ratio.

    scripts/bench_first_search.py [--fragments 10000] [--model-dir ../shared/models/all-MiniLM-L6-v2-onnx]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from eval_beir import Conn, load_jsonl, start_daemon  # noqa: E402

SHARED = REPO.parent / "shared"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fragments", type=int, default=10000)
    ap.add_argument("--model-dir", default=str(SHARED / "models" / "all-MiniLM-L6-v2-onnx"))
    args = ap.parse_args()
    docs = load_jsonl(SHARED / "eval" / "scifact" / "corpus.jsonl")
    work = Path(tempfile.mkdtemp(prefix="mbf", dir="/tmp"))
    home = work / "h"
    proc = start_daemon(home, args.model_dir, args.fragments)
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        vid = conn.call("vault.create", {"name": "bench", "passphrase": "bench"})["vault_id"]
        n = 0
        while n < args.fragments:
            d = docs[n % len(docs)]
            text = (d["text"] or d["title"])[:700]
            conn.call("memory.add", {"vault": vid, "title": d.get("title", ""), "body": f"{text} ({n})"})
            n += 1
        t0 = time.perf_counter()
        while conn.call("rag.index", {"vault": vid})["remaining"]:
            pass
        conn.call("rag.search", {"vault": vid, "query": "protein folding", "mode": "vector"})
        embed_s = time.perf_counter() - t0
        conn.call("vault.lock", {"vault": vid})
        conn.call("vault.unlock", {"vault": vid, "passphrase": "bench"})
        t0 = time.perf_counter()
        conn.call("rag.search", {"vault": vid, "query": "protein folding", "mode": "vector"})
        sealed_s = time.perf_counter() - t0
        st = conn.call("rag.status", {"vault": vid})
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "fragments": st["fragments"],
        "embedded": st["embedding"]["embedded"],
        "first_search_with_sealed_vectors_s": round(sealed_s, 3),
        "first_search_with_re_embedding_s": round(embed_s, 3),
        "speedup": round(embed_s / sealed_s, 1),
        "model_dir": args.model_dir,
    }, indent=2))


if __name__ == "__main__":
    main()
