#!/usr/bin/env python3
"""BM25 speed of Memories next to bm25s and rank_bm25, and ingest throughput next to raw jieba.

Prints one JSON object. In one run, on the same SciFact test queries:
- our bm25 query latency inside the daemon (its own timings) and over the socket;
- end-to-end CLI latency (one `memories rag search` process per query);
- bm25s and rank_bm25 on the same corpus and queries, in a separate benchmark virtualenv
  (`.bench-venv/`, created on first use; they are never installed into the product's venv);
- ingest MB/s of the English SciFact corpus and of the Chinese tldr pages through `rag ingest`,
  the first-search index build time, and raw `jieba.cut_for_search` MB/s on the same Chinese text.

    scripts/bench_bm25.py [--max-queries N] [--cli-queries N] [--skip-peers]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from eval_beir import Conn, load_jsonl, load_qrels, start_daemon  # noqa: E402

SHARED = REPO.parent / "shared"
BENCH_VENV = REPO / ".bench-venv"

PEER_CODE = r"""
import json, sys, time, statistics
corpus = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
queries = json.load(open(sys.argv[2], encoding="utf-8"))
texts = [(d.get("title") or "") + " " + d["text"] for d in corpus]
out = {}
import bm25s
t0 = time.perf_counter(); retriever = bm25s.BM25(); retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False); out["bm25s_index_s"] = time.perf_counter() - t0
lat = []
for q in queries:
    t = time.perf_counter(); retriever.retrieve(bm25s.tokenize([q], stopwords="en", show_progress=False), k=10, show_progress=False); lat.append((time.perf_counter() - t) * 1000)
out["bm25s_p50_ms"] = statistics.median(lat)
from rank_bm25 import BM25Okapi
t0 = time.perf_counter(); r = BM25Okapi([t.lower().split() for t in texts]); out["rank_bm25_index_s"] = time.perf_counter() - t0
lat = []
for q in queries[:60]:
    t = time.perf_counter(); r.get_top_n(q.lower().split(), texts, n=10); lat.append((time.perf_counter() - t) * 1000)
out["rank_bm25_p50_ms"] = statistics.median(lat)
print(json.dumps(out))
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * q))], 3)


def peers(corpus_path: Path, queries: list[str]) -> dict[str, Any]:
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "bm25s", "rank_bm25", "numpy", "scipy"], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(queries, f)
    r = subprocess.run([str(py), "-c", PEER_CODE, str(corpus_path), f.name], capture_output=True, text=True, check=True)
    return {k: round(v, 3) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def ingest_folder(conn: Conn, vid: str, folder: Path) -> dict[str, Any]:
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    out = conn.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    conn.call("rag.search", {"vault": vid, "query": "warmup", "mode": "bm25"})
    build_s = time.perf_counter() - t0
    return {
        "files": out["added"],
        "mb": round(size / 1e6, 2),
        "ingest_seconds": round(ingest_s, 3),
        "ingest_mb_per_s": round(size / 1e6 / ingest_s, 2),
        "first_search_index_build_seconds": round(build_s, 3),
        "ingest_plus_index_mb_per_s": round(size / 1e6 / (ingest_s + build_s), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-queries", type=int, default=300)
    ap.add_argument("--cli-queries", type=int, default=20)
    ap.add_argument("--skip-peers", action="store_true")
    args = ap.parse_args()
    sf = SHARED / "eval" / "scifact"
    corpus = load_jsonl(sf / "corpus.jsonl")
    qtext = {q["_id"]: q["text"] for q in load_jsonl(sf / "queries.jsonl")}
    queries = [qtext[q] for q in load_qrels(sf / "qrels" / "test.tsv") if q in qtext][: args.max_queries]
    result: dict[str, Any] = {"queries": len(queries)}

    work = Path(tempfile.mkdtemp(prefix="mbb", dir="/tmp"))
    home = work / "h"
    proc = start_daemon(home, None, len(corpus))
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        # English: SciFact as Markdown files.
        en = work / "en"
        en.mkdir()
        for d in corpus:
            (en / f"{d['_id']}.md").write_text(f"# {d.get('title') or d['_id']}\n\n{d['text']}\n", encoding="utf-8")
        vid = conn.call("vault.create", {"name": "en", "passphrase": "bench"})["vault_id"]
        result["ingest_english_scifact"] = ingest_folder(conn, vid, en)
        inside, socket_ms = [], []
        for q in queries:
            t0 = time.perf_counter()
            r = conn.call("rag.search", {"vault": vid, "query": q[:1000], "mode": "bm25", "limit": 10})
            socket_ms.append((time.perf_counter() - t0) * 1000)
            inside.append(r["timings_ms"]["total_ms"])
        result["ours_in_daemon_p50_ms"] = pct(inside, 0.5)
        result["ours_in_daemon_p95_ms"] = pct(inside, 0.95)
        result["ours_socket_p50_ms"] = pct(socket_ms, 0.5)
        cli = []
        for q in queries[: args.cli_queries]:
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "memories_cli.main", "--home", str(home), "--json", "rag", "search", vid, q[:1000], "--mode", "bm25"],
                capture_output=True, check=True, cwd=str(REPO),
            )
            cli.append((time.perf_counter() - t0) * 1000)
        result["ours_cli_p50_ms"] = pct(cli, 0.5)
        # Chinese: tldr pages.zh.
        zh = work / "zh"
        with tarfile.open(SHARED / "eval" / "tldr.tar.gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and "/pages.zh/" in "/" + m.name and m.name.endswith(".md")]
            tar.extractall(zh, members=members, filter="data")
        zh_files = [p for p in zh.rglob("*.md")]
        zh_text = "\n".join(p.read_text("utf-8") for p in zh_files)
        vid_zh = conn.call("vault.create", {"name": "zh", "passphrase": "bench"})["vault_id"]
        result["ingest_chinese_tldr"] = ingest_folder(conn, vid_zh, zh)
    finally:
        proc.terminate()
        proc.wait(60)

    from memoriesd.text.segment import configure

    configure(Path(tempfile.mkdtemp(prefix="mbj", dir="/tmp")))
    import jieba

    t0 = time.perf_counter()
    for line in zh_text.splitlines():
        list(jieba.cut_for_search(line))
    raw_s = time.perf_counter() - t0
    mb = len(zh_text.encode("utf-8")) / 1e6
    result["raw_jieba_cut_for_search_mb_per_s"] = round(mb / raw_s, 2)
    ours = result["ingest_chinese_tldr"]["ingest_plus_index_mb_per_s"]
    result["chinese_ours_over_raw_jieba"] = round(ours / (mb / raw_s), 3)

    if not args.skip_peers:
        p = peers(sf / "corpus.jsonl", queries)
        result["peers"] = p
        result["ratio_ours_in_daemon_over_bm25s"] = round(result["ours_in_daemon_p50_ms"] / p["bm25s_p50_ms"], 2)
        result["ratio_ours_in_daemon_over_rank_bm25"] = round(result["ours_in_daemon_p50_ms"] / p["rank_bm25_p50_ms"], 3)
    result["targets"] = {
        "in_daemon_p50_under_10ms": result["ours_in_daemon_p50_ms"] < 10,
        "english_ingest_at_least_5_mb_s": result["ingest_english_scifact"]["ingest_mb_per_s"] >= 5,
        "chinese_at_least_80pct_of_raw_jieba": result["chinese_ours_over_raw_jieba"] >= 0.8,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
