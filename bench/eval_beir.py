#!/usr/bin/env python3
"""Retrieval quality of Memories on a BEIR-format dataset, through the real daemon.

Ingests ``corpus.jsonl`` into a throw-away vault the way people add notes: each document becomes a
Markdown file ``# Title`` + text, ingested with ``rag ingest`` (``--ingest records`` adds records
through ``memory.add`` instead, title apart, as earlier versions did), runs the
queries of ``qrels/<split>.tsv`` with ``rag search``, ranks documents by their best fragment and
prints one JSON object per run: ndcg@10, recall@100, p50_ms, p95_ms, queries, documents, mode.

    python -m bench.eval_beir ../shared/eval/scifact --mode bm25
    python -m bench.eval_beir ../shared/eval/scifact --mode hybrid --mode vector --model-dir ../shared/models/all-MiniLM-L6-v2-onnx
    python -m bench.eval_beir ../shared/eval/scifact --mode hybrid --rrf-k 10 --rrf-k 20 --rrf-k 60 --rrf-k 100 --rerank both

Several --mode / --rrf-k / --rerank values share one ingest and one embedding pass. With
--home DIR the vault (and its sealed vectors) is kept and reused by the next run. Each
--vector-precision (float32, float16, int8: ``[rag.cache] vector_precision``) restarts the daemon on
the same sealed vectors, so the precisions are compared on identical embeddings in one run:

    python -m bench.eval_beir ../shared/eval/scifact --mode vector --mode hybrid --model-dir M --home DIR \
        --vector-precision float32 --vector-precision float16 --vector-precision int8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from memoriesd.server import protocol  # noqa: E402
from memoriesd.workers.routes import ENDING, route_request  # noqa: E402

PASSPHRASE = "eval passphrase"


class Conn:
    """A client of the daemon: each vault's request goes to the process serving that vault
    (``vault.route`` on the daemon's socket first, as the CLI does); the route is kept per vault and
    asked again when its process has ended (locked) under it."""

    def __init__(self, sock_path: Path) -> None:
        self.path = str(sock_path)
        self.socks: dict[str, socket.socket] = {}
        self.routes: dict[str, str] = {}
        self.n = 0

    def _exchange(self, path: str, method: str, params: dict[str, Any]) -> Any:
        if path not in self.socks:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            self.socks[path] = s
        s = self.socks[path]
        self.n += 1
        s.sendall(protocol.encode({"id": self.n, "method": method, "params": params}))
        while True:
            msg = protocol.recv_frame(s)
            if "progress" in msg:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']['code']}: {msg['error']['message']}")
            return msg["result"]

    def _route(self, ask: dict[str, Any]) -> str:
        key = json.dumps(ask, sort_keys=True)
        if ask.get("new"):
            self.routes.pop(key, None)  # a new vault's process: a fresh one each time, never the last one's
        if key not in self.routes:
            route = self._exchange(self.path, "vault.route", ask)
            if isinstance(route, dict) and isinstance(route.get("error"), dict):
                raise RuntimeError(f"vault.route: {route['error'].get('code')}: {route['error'].get('message')}")
            self.routes[key] = str(route["socket"]) if isinstance(route, dict) and route.get("socket") else self.path
        return self.routes[key]

    def call(self, method: str, params: dict[str, Any]) -> Any:
        ask = route_request(method, params)
        for attempt in range(3):
            path = self.path if ask is None else self._route(ask)
            try:
                return self._exchange(path, method, params)
            except (OSError, RuntimeError) as exc:
                ended = isinstance(exc, OSError) or ENDING in str(exc)
                if not ended or path == self.path or attempt == 2:
                    raise
                self.socks.pop(path, None)
                self.routes.clear()  # the vault's process ended (locked): ask where it is served now
        raise AssertionError("unreachable")


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as f:
        next(f)
        for line in f:
            q, d, s = line.rstrip("\n").split("\t")
            out.setdefault(q, {})[d] = int(s)
    return out


def ndcg_at(ranked: list[str], rel: dict[str, int], k: int = 10) -> float:
    dcg = sum((2 ** rel.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum((2**r - 1) / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rel: dict[str, int], k: int = 100) -> float:
    relevant = {d for d, s in rel.items() if s > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def start_daemon(
    home: Path, model_dir: str | None, n_docs: int, precision: str | None = None, rag_extra: str = "",
    code: Path = REPO,
) -> subprocess.Popen[bytes]:
    """``rag_extra``: more ``[rag]`` settings, one ``key = value`` per line. ``code``: the checkout whose
    ``memoriesd`` runs (``python -m`` imports it from the working directory; bench/ab_recall.py)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = [
        "[vault]\nkdf_memory_kib = 65536\nkdf_iterations = 3\nkdf_lanes = 4\n",
        "[daemon]\nauto_lock_minutes = 0\n",
        f"[rag]\noperation_budget_seconds = 3600\non_demand_embed_limit = 0\n{rag_extra}",
    ]
    if model_dir:
        cfg.append(f'local_model_dir = "{Path(model_dir).resolve()}"\nlocal_threads = {os.cpu_count() or 2}\n')
    big = max(100_000, n_docs * 20)
    cfg.append(f"[rag.cache]\nmax_fragments = {big}\nmax_source_mib = 2048\nmax_vector_mib = 4096\n")
    if precision:
        cfg.append(f'vector_precision = "{precision}"\n')
    (home / "config.toml").write_text("".join(cfg))
    return launch_daemon(home, code)


def launch_daemon(home: Path, code: Path = REPO) -> subprocess.Popen[bytes]:
    """Start ``memoriesd`` on ``home`` (its config.toml written) and wait until it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memoriesd.main", "--home", str(home)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(code),
    )
    sock = home / "run" / "memoriesd.sock"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daemon failed: {proc.stderr.read().decode() if proc.stderr else ''}")
        if sock.exists():
            try:
                Conn(sock).call("daemon.status", {})
                return proc
            except OSError:
                pass
        time.sleep(0.05)
    raise SystemExit("daemon did not start")


def ingest_files(conn: Conn, vid: str, corpus: list[dict[str, Any]], home: Path) -> float:
    """Write each document as ``d000123.md`` (``# Title`` + text) and `rag ingest` the folder.
    Records the record id -> document id mapping in ``home/eval-records.json``; returns seconds."""
    folder = home / "eval-docs"
    folder.mkdir(exist_ok=True)
    names: dict[str, str] = {}
    for i, doc in enumerate(corpus):
        name = f"d{i:06d}.md"
        title = " ".join((doc.get("title") or "").split())
        text = doc["text"] or ""
        (folder / name).write_text(f"# {title}\n\n{text}\n" if title else f"{text}\n", encoding="utf-8")
        names[name] = str(doc["_id"])
    t0 = time.perf_counter()
    report = conn.call("rag.ingest", {"vault": vid, "paths": [str(folder.resolve())], "recursive": True})
    seconds = time.perf_counter() - t0
    if report["refused"]:
        print(json.dumps({"refused": report["refused"][:5], "count": len(report["refused"])}), file=sys.stderr)
    rid_to_doc = {r["id"]: names[Path(r["path"]).name] for r in report["records"] if Path(r.get("path", "")).name in names}
    (home / "eval-records.json").write_text(json.dumps(rid_to_doc))
    return seconds


def mean(values: Any) -> float:
    return round(statistics.fmean(values), 4)


def run_queries(conn: Conn, base: dict[str, Any], qids: list[str], queries: dict[str, str], rid_to_doc: dict[str, str],
                limit: int) -> tuple[dict[str, list[str]], list[float]]:
    """Each query through ``rag.search`` (``base`` params, ``limit``): its documents, best first (a
    document ranked by its best fragment: its first appearance), and the latencies in ms."""
    ranked: dict[str, list[str]] = {}
    lat = []
    for qid in qids:
        t0 = time.perf_counter()
        try:
            res = conn.call("rag.search", base | {"query": queries[qid][:1000], "limit": limit})["results"]
        except RuntimeError as exc:
            if "query_invalid" not in str(exc):
                raise
            res = []
        lat.append((time.perf_counter() - t0) * 1000)
        docs: list[str] = []
        for item in res:
            d = rid_to_doc.get(item["record_id"])
            if d and d not in docs:
                docs.append(d)
        ranked[qid] = docs
    return ranked, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--mode", action="append", choices=["bm25", "vector", "hybrid"])
    ap.add_argument("--model-dir", default=None, help="a local embedding model directory (vector and hybrid modes)")
    ap.add_argument("--no-rerank", action="store_true", help="skip the light reranker (hybrid)")
    ap.add_argument("--rerank", choices=["on", "off", "both"], default=None, help="run hybrid with, without, or both")
    ap.add_argument("--rrf-k", type=int, action="append", help="RRF k (repeatable)")
    ap.add_argument("--vector-weight", type=float, action="append", help="hybrid: vector weight in weighted RRF (repeatable; default: the model's)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--limit", type=int, default=100, help="results per query (1-100): documents, or fragments for --grouping fragments")
    ap.add_argument("--grouping", choices=["fragments", "documents", "both"], default="both",
                    help="rank `rag search --fragments` (documents by their best fragment, as many as the fragments hold), "
                    "the default one hit per document, or both in one run (the default)")
    ap.add_argument("--vector-precision", action="append", choices=["float32", "float16", "int8"],
                    help="[rag.cache] vector_precision (repeatable: the daemon restarts on the same sealed vectors "
                    "for each; default: the config default)")
    ap.add_argument("--home", type=Path, default=None, help="keep the vault here and reuse it next time")
    ap.add_argument("--ingest", choices=["files", "records"], default="files",
                    help="files: `# Title` Markdown files through rag ingest (the default, as people add notes); "
                    "records: memory.add with the title apart")
    args = ap.parse_args()
    modes = args.mode or ["bm25"]
    if any(m != "bm25" for m in modes) and not args.model_dir:
        ap.error("--mode vector/hybrid needs --model-dir")
    rerank_opts = {"on": [True], "off": [False], "both": [True, False]}[args.rerank] if args.rerank else [not args.no_rerank]
    ks = args.rrf_k or [60]
    weights: list[float | None] = list(args.vector_weight or [None])

    corpus = load_jsonl(args.dataset / "corpus.jsonl")
    queries = {q["_id"]: q["text"] for q in load_jsonl(args.dataset / "queries.jsonl")}
    qrels = load_qrels(args.dataset / "qrels" / f"{args.split}.tsv")
    qids = [q for q in qrels if q in queries][: args.max_queries]

    keep = args.home is not None
    tmp_root = Path(tempfile.mkdtemp(prefix="mev", dir="/tmp")) if not keep else None
    home = args.home.resolve() if keep else tmp_root / "h"  # type: ignore[operator]
    try:
        for precision in args.vector_precision or [None]:
            run_precision(args, home, precision, corpus, queries, qrels, qids, modes, rerank_opts, ks, weights)
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)


def run_precision(args: Any, home: Path, precision: str | None, corpus: list[dict[str, Any]], queries: dict[str, str],
                  qrels: dict[str, dict[str, int]], qids: list[str], modes: list[str], rerank_opts: list[bool],
                  ks: list[int], weights: list[float | None]) -> None:
    """One daemon on ``home`` with ``[rag.cache] vector_precision = precision``: every run, one JSON line each."""
    proc = start_daemon(home, args.model_dir, len(corpus), precision)
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        vaults = conn.call("vault.list", {})["vaults"]
        ingest_s = None
        if vaults:
            vid = vaults[0]["vault_id"]
            conn.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
        else:
            vid = conn.call("vault.create", {"name": "eval", "passphrase": PASSPHRASE})["vault_id"]
            t0 = time.perf_counter()
            if args.ingest == "files":
                ingest_s = ingest_files(conn, vid, corpus, home)
            else:
                for doc in corpus:
                    conn.call("memory.add", {"vault": vid, "title": doc.get("title") or "", "body": doc["text"] or doc.get("title") or "-", "tags": [f"beir:{doc['_id']}"]})
                ingest_s = time.perf_counter() - t0
        # Map record ids back to BEIR ids.
        rid_to_doc = {}
        mapping = home / "eval-records.json"
        if mapping.exists():
            rid_to_doc = json.loads(mapping.read_text())
        for r in conn.call("memory.list", {"vault": vid})["records"]:
            tag = next((t for t in r["tags"] if t.startswith("beir:")), None)
            if tag:
                rid_to_doc[r["id"]] = tag[5:]
        st = conn.call("rag.status", {"vault": vid})
        # The lexical index (segmentation, FTS5 rows) is written on the first bm25 query: time one.
        t0 = time.perf_counter()
        conn.call("rag.search", {"vault": vid, "query": "index warm-up", "mode": "bm25", "limit": 1})
        build_s = time.perf_counter() - t0
        embed_s = None
        if args.model_dir:
            t0 = time.perf_counter()
            while True:
                out = conn.call("rag.index", {"vault": vid})
                if out["remaining"] == 0:
                    break
            embed_s = time.perf_counter() - t0
        runs = []
        for mode in modes:
            for rr in rerank_opts if mode == "hybrid" else [True]:
                for k in ks if mode == "hybrid" else [60]:
                    for w in weights if mode == "hybrid" else [None]:
                        runs.append((mode, rr, k, w))
        common = {
            "dataset": args.dataset.name, "queries": len(qids), "documents": len(corpus), "fragments": st["fragments"],
            "ingest_seconds": None if ingest_s is None else round(ingest_s, 2), "index_build_seconds": round(build_s, 2),
            "embed_seconds": None if embed_s is None else round(embed_s, 2), "model_dir": args.model_dir,
            "vector_precision": precision,
        }
        groupings = ["fragments", "documents"] if args.grouping == "both" else [args.grouping]
        for mode, rr, k, w in runs:
            base: dict[str, Any] = {"vault": vid, "mode": mode, "no_rerank": not rr, "rrf_k": k}
            if w is not None:
                base["vector_weight"] = w
            judged: dict[str, int] = {}  # per query: the documents the per-fragment list held
            for grouping in groupings:
                frag = grouping == "fragments"
                ranked, lat = run_queries(conn, base | {"fragments": frag}, qids, queries, rid_to_doc, args.limit)
                result: dict[str, Any] = {
                    "mode": mode, "grouping": grouping, "rerank": rr if mode == "hybrid" else None,
                    "rrf_k": k if mode == "hybrid" else None, "vector_weight": w if mode == "hybrid" else None,
                    "ndcg@10": mean(ndcg_at(ranked[q], qrels[q]) for q in qids),
                    "recall@100": mean(recall_at(ranked[q], qrels[q]) for q in qids),
                    "documents_judged": mean(len(ranked[q]) for q in qids),
                    "limit": f"{args.limit} {'fragments' if frag else 'documents'}",
                }
                if frag:
                    judged = {q: len(ranked[q]) for q in qids}
                else:
                    # What `rag search` shows by default (--limit 10): its own candidates, not the top of 100.
                    top10, lat10 = run_queries(conn, base | {"fragments": False}, qids, queries, rid_to_doc, 10)
                    result["ndcg@10_limit10"] = mean(ndcg_at(top10[q], qrels[q]) for q in qids)
                    result["p50_ms_limit10"] = round(sorted(lat10)[len(lat10) // 2], 2)
                    if judged:  # the same number of documents judged as the per-fragment list held
                        result["recall_same_documents"] = mean(recall_at(ranked[q][: judged[q]], qrels[q]) for q in qids)
                lat.sort()
                result |= {"p50_ms": round(lat[len(lat) // 2], 2), "p95_ms": round(lat[int(len(lat) * 0.95) - 1], 2)}
                print(json.dumps(result | common), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
