#!/usr/bin/env python3
"""Time to the first search after unlock: sealed vectors reloaded vs re-embedding, and the sealed
lexical snapshot restored vs the BM25 index rebuilt.

Prints one JSON object on stdout (progress on stderr). Through a real daemon on a throw-away home.

Vector part (skip with ``--skip-vector``):

1. builds a vault of ``--fragments`` records with ``memory.add``, each one fragment (a SciFact
   abstract cut to 600 characters plus a serial number, so no two share a fingerprint);
2. sets ``[rag] local_model_dir`` to the model (default: all-MiniLM-L6-v2) and runs ``rag.index``
   until ``remaining == 0`` (the embedding time and rate are reported);
3. locks, unlocks and times the first ``rag.search --mode vector``: the index is rebuilt from the
   vault and the vectors come back from the sealed ``vectors-*.bin`` sidecar;
4. the re-embedding cost, ``--reembed measure`` (default): lock, delete the sidecar, unlock, and
   time ``rag.index`` until done plus the first vector search; ``--reembed extrapolate``: the
   same figure estimated from step 2's embedding rate (the output says which).

The daemon's ``on_demand_embed_limit`` is 0 here, so a search never embeds silently.

Lexical part, ``"lexical"`` (skip with ``--skip-lexical``), for each size of ``--lexical-fragments``
(default 10,000 and 100,000), on its own daemon with the default (strong) KDF and no model:

1. writes SciFact abstracts as Markdown files (``# title (copy n)`` + text), repeated until the
   fragment count is reached, and ``rag ingest``s the folder (the user's path); the first BM25
   search builds the index, then the background writer seals the snapshot (waited for);
2. ``--repeats`` cycles of: lock, unlock, first ``rag.search --mode bm25`` with the snapshot
   (``snapshot``), then lock, delete ``lexical-index.bin``, unlock, first search (``cold``: the
   index is rebuilt from the records, as before the snapshot existed). ``unlock_to_first_result``
   is the unlock request plus the first search; each cycle checks in the daemon log that the
   snapshot was (or was not) the source. ``lock_seconds`` shows what lock costs when it writes;
3. ``catch_up``: 100 more notes ingested while unlocked, lock (too few changes to rewrite the
   snapshot), unlock, first search: the snapshot plus those records applied incrementally;
4. ``cli``: the same as a user types it, ``memories vault unlock`` then ``memories rag search``,
   one process each, with the snapshot and cold;
5. ``search_speed``: BM25 ``any`` over the SciFact queries (full claims, and their first three
   words), p50/p95 of the daemon's own ``total_ms`` and of the socket round trip, warm index; and
   the p50 of 30 ``memories rag search`` processes against the daemon p50 plus ``memories --help``
   (the CLI's own start).

First-result part, ``"first_result"`` (skip with ``--skip-first-result``; details in
``bench/first_result_bench.py``), for each size of ``--first-fragments`` (default 10,000 and
100,000), at default settings (KDF, caps, int8 vectors): a vault ingested from SciFact Markdown files
with 768-dimension vectors from a real embedding service on 127.0.0.1 (``tests/embed_server.py``,
not a model: what is timed does not depend on what vectors mean), then ``--repeats`` cycles of
unlock -> first ``bm25`` result and unlock -> first ``vector`` result (``query_embed_ms``, the
query's own embedding request, reported apart and subtracted in the ``..._excl_query`` figures),
by this tree (``current``), by this tree reading the vector sidecar whole as before
(``whole_file_vectors``) and, with ``--baseline-tree DIR``, by another source tree (``baseline``),
interleaved; with the daemon's peak RSS after the first cycle.

    .venv/bin/python -m bench.bench_first_search [--fragments 10000] [--reembed measure|extrapolate]
        [--skip-vector] [--skip-lexical] [--lexical-fragments 10000,100000] [--repeats 3]
        [--skip-first-result] [--first-fragments 10000,100000] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import PASSPHRASE, Conn, load_jsonl, start_daemon  # noqa: E402
from bench.first_result_bench import first_result_bench  # noqa: E402
from bench.lexical_first_search import lexical_bench  # noqa: E402

SHARED = REPO.parent / "shared"
QUERY = "protein folding in the endoplasmic reticulum"
BODY_CHARS = 600  # under the 768-character fragment size: one fragment per record


def log(msg: str) -> None:
    print(f"[bench_first_search] {msg}", file=sys.stderr, flush=True)


def index_until_done(conn: Conn, vid: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    embedded = 0
    while True:
        out = conn.call("rag.index", {"vault": vid})
        embedded += out["embedded"]
        log(f"  embedded {out['total'] - out['remaining']}/{out['total']}")
        if out["remaining"] == 0:
            return time.perf_counter() - t0, embedded


def timed_search(conn: Conn, vid: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = conn.call("rag.search", {"vault": vid, "query": QUERY, "mode": "vector", "limit": 10})
    return {
        "seconds": round(time.perf_counter() - t0, 3),
        "timings_ms": r["timings_ms"],
        "results": len(r["results"]),
        "missing_vectors": r["missing_vectors"],
    }


def relock(conn: Conn, vid: str, home: Path, *, drop_vectors: bool) -> dict[str, Any]:
    conn.call("vault.lock", {"vault": vid})
    removed = 0
    if drop_vectors:
        for p in (home / "vaults").rglob("vectors-*.bin"):
            p.unlink()
            removed += 1
    t0 = time.perf_counter()
    conn.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
    return {"unlock_seconds": round(time.perf_counter() - t0, 3), "sidecars_removed": removed}


def vector_bench(args: argparse.Namespace, docs: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {"requested_fragments": args.fragments, "model_dir": args.model_dir}
    work = Path(tempfile.mkdtemp(prefix="mbf", dir="/tmp"))
    home = work / "h"
    proc = start_daemon(home, args.model_dir, args.fragments)
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        vid = conn.call("vault.create", {"name": "bench", "passphrase": PASSPHRASE})["vault_id"]
        log(f"adding {args.fragments} records")
        t0 = time.perf_counter()
        for n in range(args.fragments):
            d = docs[n % len(docs)]
            text = (d["text"] or d.get("title") or "-")[:BODY_CHARS]
            conn.call("memory.add", {"vault": vid, "title": d.get("title") or "", "body": f"{text} (#{n})"})
        result["add_seconds"] = round(time.perf_counter() - t0, 2)
        st = conn.call("rag.status", {"vault": vid})
        result["fragments"] = st["fragments"]

        log("embedding (rag.index until remaining == 0)")
        embed_s, embedded = index_until_done(conn, vid)
        result["initial_embed"] = {
            "seconds": round(embed_s, 2),
            "embedded": embedded,
            "fragments_per_second": round(embedded / embed_s, 1),
        }
        result["warm_vector_search"] = timed_search(conn, vid)
        sidecars = list((home / "vaults").rglob("vectors-*.bin"))
        result["sealed_sidecar_mib"] = round(sum(p.stat().st_size for p in sidecars) / 2**20, 2)

        log("lock, unlock, first vector search (sealed vectors)")
        sealed = relock(conn, vid, home, drop_vectors=False)
        sealed["first_search"] = timed_search(conn, vid)
        sealed["second_search"] = timed_search(conn, vid)
        result["sealed"] = sealed
        sealed_s = sealed["first_search"]["seconds"]

        if args.reembed == "measure":
            log("lock, delete the sidecar, unlock, rag.index + first vector search (re-embedding)")
            re = relock(conn, vid, home, drop_vectors=True)
            idx_s, re_embedded = index_until_done(conn, vid)
            search = timed_search(conn, vid)
            re.update({
                "how": "measured: sidecar deleted while locked, then rag.index until done and the first vector search",
                "index_seconds": round(idx_s, 2),
                "embedded": re_embedded,
                "first_search": search,
                "seconds": round(idx_s + search["seconds"], 2),
            })
        else:
            est = result["fragments"] / result["initial_embed"]["fragments_per_second"]
            re = {
                "how": "extrapolated: fragments / the initial embedding rate, plus the warm search",
                "seconds": round(est + result["warm_vector_search"]["seconds"], 2),
            }
        result["reembed"] = re
        result["reembed_over_sealed_first_search"] = round(re["seconds"] / sealed_s, 1)
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fragments", type=int, default=10000)
    ap.add_argument("--model-dir", default=str(SHARED / "models" / "all-MiniLM-L6-v2-onnx"))
    ap.add_argument("--reembed", choices=["measure", "extrapolate"], default="measure")
    ap.add_argument("--skip-vector", action="store_true", help="skip the vector part (sealed vectors vs re-embedding)")
    ap.add_argument("--skip-lexical", action="store_true", help="skip the lexical part")
    ap.add_argument("--lexical-fragments", default="10000,100000", help="comma-separated vault sizes (fragments)")
    ap.add_argument("--repeats", type=int, default=3, help="lock/unlock cycles per case (lexical, first result)")
    ap.add_argument("--skip-first-result", action="store_true", help="no unlock -> first bm25/vector result part")
    ap.add_argument("--first-fragments", default="10000,100000", help="comma-separated vault sizes (first result)")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="a source tree to compare against in the first-result part (e.g. git archive of a commit)")
    args = ap.parse_args()
    docs = load_jsonl(SHARED / "eval" / "scifact" / "corpus.jsonl")
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    if not args.skip_vector:
        result.update(vector_bench(args, docs))
    if not args.skip_lexical:
        queries = [q["text"] for q in load_jsonl(SHARED / "eval" / "scifact" / "queries.jsonl")]
        result["lexical"] = {}
        for size in [int(x) for x in args.lexical_fragments.split(",") if x.strip()]:
            result["lexical"][str(size)] = lexical_bench(size, docs, queries, repeats=args.repeats, log=log)
        sizes = sorted(result["lexical"], key=int)
        if len(sizes) > 1:
            small, big = result["lexical"][sizes[0]], result["lexical"][sizes[-1]]
            result["lexical_growth"] = {
                "fragments_ratio": round(big["fragments"] / small["fragments"], 1),
                "snapshot_unlock_to_first_result_ratio": round(
                    big["snapshot"]["unlock_to_first_result_seconds"] / small["snapshot"]["unlock_to_first_result_seconds"], 2),
                "bm25_any_p50_ratio": round(
                    big["search_speed"]["claims"]["daemon_total_ms_p50"] / small["search_speed"]["claims"]["daemon_total_ms_p50"], 2),
            }
    if not args.skip_first_result:
        result["first_result"] = {}
        for size in [int(x) for x in args.first_fragments.split(",") if x.strip()]:
            result["first_result"][str(size)] = first_result_bench(
                size, docs, repeats=args.repeats, baseline_tree=args.baseline_tree, log=log)
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
