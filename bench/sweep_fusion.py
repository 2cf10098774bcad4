#!/usr/bin/env python3
"""Compare hybrid fusion functions on one embedded BEIR vault, offline, from the same candidates.

Runs each query once in ``bm25`` and once in ``vector`` mode through the real daemon (``rag search``,
100 fragments each, the candidate lists hybrid fuses), then scores fusion functions over those two lists
without asking the daemon again, so a sweep of dozens of settings costs seconds:

- ``rrf``: weighted reciprocal rank fusion, ``w_bm25 / (k + rank) + w_vec / (k + rank)``;
- ``convex``: ``alpha * cos_n + (1 - alpha) * bm25_n`` with the per-query min-max normalised scores of each
  list (a candidate absent from a list gets that list's minimum, i.e. 0).

Documents are ranked by their best fragment, as ``eval_beir.py`` does; prints one JSON object per setting.
The product's own figure for the chosen setting comes from ``eval_beir.py`` (which also applies the
light reranker); this script only narrows the choice.

    python -m bench.sweep_fusion ../shared/eval/scifact --home /work/evalhome-scifact-gemma
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.eval_beir import PASSPHRASE, Conn, load_jsonl, load_qrels, ndcg_at, recall_at, start_daemon  # noqa: E402

Key = tuple[str, int]


def fetch(conn: Conn, vid: str, query: str, mode: str, limit: int) -> list[dict[str, Any]]:
    try:
        return conn.call("rag.search", {"vault": vid, "query": query[:1000], "mode": mode, "limit": limit})["results"]
    except RuntimeError as exc:
        if "query_invalid" in str(exc):
            return []
        raise


def minmax(scores: dict[Key, float]) -> dict[Key, float]:
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    span = hi - lo
    return {k: ((v - lo) / span if span > 0 else 1.0) for k, v in scores.items()}


def rank_docs(order: list[Key], rid_to_doc: dict[str, str]) -> list[str]:
    out: list[str] = []
    for rid, _ in order:
        d = rid_to_doc.get(rid)
        if d and d not in out:
            out.append(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--home", type=Path, required=True, help="an eval_beir.py --home with the vault embedded")
    ap.add_argument("--model-dir", default=None, help="defaults to the home's configured local_model_dir")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--dump", type=Path, default=None, help="write the candidate lists here (JSON) for reuse")
    ap.add_argument("--load", type=Path, default=None, help="read candidate lists written by --dump")
    args = ap.parse_args()

    queries = {q["_id"]: q["text"] for q in load_jsonl(args.dataset / "queries.jsonl")}
    qrels = load_qrels(args.dataset / "qrels" / f"{args.split}.tsv")
    qids = [q for q in qrels if q in queries]
    home = args.home.resolve()
    if args.load:
        data = json.loads(args.load.read_text())
    else:
        model_dir = args.model_dir
        if model_dir is None:
            for line in (home / "config.toml").read_text().splitlines():
                if line.startswith("local_model_dir"):
                    model_dir = line.split("=", 1)[1].strip().strip('"')
        proc = start_daemon(home, model_dir, 0)
        try:
            conn = Conn(home / "run" / "memoriesd.sock")
            vid = conn.call("vault.list", {})["vaults"][0]["vault_id"]
            conn.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
            rid_to_doc = json.loads((home / "eval-records.json").read_text())
            data = {"rid_to_doc": rid_to_doc, "queries": {}}
            for qid in qids:
                data["queries"][qid] = {
                    mode: [[r["record_id"], r["start"], r["score"]] for r in fetch(conn, vid, queries[qid], mode, args.limit)]
                    for mode in ("bm25", "vector")
                }
        finally:
            proc.terminate()
            proc.wait(60)
        if args.dump:
            args.dump.write_text(json.dumps(data))
    rid_to_doc = data["rid_to_doc"]

    def evaluate(score_fn: Any) -> tuple[float, float]:
        nd, rc = [], []
        for qid in qids:
            lists = data["queries"][qid]
            bm = {(r, s): float(v) for r, s, v in lists["bm25"]}
            ve = {(r, s): float(v) for r, s, v in lists["vector"]}
            order = score_fn(bm, ve)
            ranked = rank_docs(order, rid_to_doc)
            nd.append(ndcg_at(ranked, qrels[qid]))
            rc.append(recall_at(ranked, qrels[qid]))
        return round(statistics.fmean(nd), 4), round(statistics.fmean(rc), 4)

    def ranks(scores: dict[Key, float]) -> dict[Key, int]:
        return {k: i for i, k in enumerate(sorted(scores, key=lambda x: -scores[x]), start=1)}

    def rrf(k: int, w: float) -> Any:
        def fn(bm: dict[Key, float], ve: dict[Key, float]) -> list[Key]:
            rb, rv = ranks(bm), ranks(ve)
            keys = set(rb) | set(rv)
            s = {x: (1 / (k + rb[x]) if x in rb else 0) + (w / (k + rv[x]) if x in rv else 0) for x in keys}
            return sorted(keys, key=lambda x: -s[x])
        return fn

    def convex(alpha: float) -> Any:
        def fn(bm: dict[Key, float], ve: dict[Key, float]) -> list[Key]:
            nb, nv = minmax(bm), minmax(ve)
            keys = set(nb) | set(nv)
            s = {x: alpha * nv.get(x, 0.0) + (1 - alpha) * nb.get(x, 0.0) for x in keys}
            return sorted(keys, key=lambda x: -s[x])
        return fn

    settings: list[tuple[dict[str, Any], Any]] = [
        ({"fusion": "bm25"}, lambda bm, ve: sorted(bm, key=lambda x: -bm[x])),
        ({"fusion": "vector"}, lambda bm, ve: sorted(ve, key=lambda x: -ve[x])),
    ]
    for k in (20, 60):
        for w in (1.0, 1.5, 2.0, 3.0, 4.0):
            settings.append(({"fusion": "rrf", "k": k, "vector_weight": w}, rrf(k, w)))
    for a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
        settings.append(({"fusion": "convex", "alpha": a}, convex(a)))
    for meta, fn in settings:
        nd, rc = evaluate(fn)
        print(json.dumps({"dataset": args.dataset.name, **meta, "ndcg@10": nd, "recall@100": rc, "queries": len(qids)}), flush=True)


if __name__ == "__main__":
    main()
