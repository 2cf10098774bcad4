#!/usr/bin/env python3
"""Should a file name that reads as words count as a note's title when it is embedded?

A note without front matter or a ``# H1`` is embedded as ``title: none | text: …`` (the model card's
form for untitled documents). This measures the alternative on a BEIR set, through ``rag ingest`` and
vector search: every document is written as ``<its title, slugged>.md`` with no H1, then

- ``stem_ignored``: the file as it is (the product's rule: the file name is not a title);
- ``stem_as_title``: the same body under ``# <the file name's words>``, which is what counting the file
  name as a title would embed (the H1 line itself is not repeated in the embedded text).

Prints one JSON object per variant (vector nDCG@10, Recall@100) and the difference. With a model that
takes no prompts (MiniLM) the title is embedded as a first line instead.

    python -m bench.measure_filename_titles /work/scifact-sub --model-dir ../shared/models/all-MiniLM-L6-v2-onnx
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.eval_beir import PASSPHRASE, Conn, load_jsonl, load_qrels, ndcg_at, recall_at, start_daemon  # noqa: E402


def slug(title: str, used: set[str]) -> str:
    base = re.sub(r"[^0-9A-Za-z]+", "-", title).strip("-").lower()[:80] or "untitled"
    name, n = base, 2
    while name in used:
        name, n = f"{base}-{n}", n + 1
    used.add(name)
    return name


def run(variant: str, corpus: list[dict[str, Any]], queries: dict[str, str], qrels: dict[str, dict[str, int]], model_dir: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="mft", dir="/tmp"))
    home, folder = root / "h", root / "notes"
    folder.mkdir(parents=True)
    used: set[str] = set()
    by_name: dict[str, str] = {}
    for doc in corpus:
        name = slug(doc.get("title") or "", used)
        body = doc["text"] or doc.get("title") or "-"
        words = name.replace("-", " ")
        text = f"# {words}\n\n{body}\n" if variant == "stem_as_title" else f"{body}\n"
        (folder / f"{name}.md").write_text(text, encoding="utf-8")
        by_name[f"{name}.md"] = str(doc["_id"])
    proc = start_daemon(home, model_dir, len(corpus))
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        vid = conn.call("vault.create", {"name": "eval", "passphrase": PASSPHRASE})["vault_id"]
        report = conn.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})
        rid_to_doc = {r["id"]: by_name[Path(r["path"]).name] for r in report["records"] if Path(r.get("path", "")).name in by_name}
        while conn.call("rag.index", {"vault": vid})["remaining"]:
            pass
        nd, rc = [], []
        for qid, rel in qrels.items():
            if qid not in queries:
                continue
            res = conn.call("rag.search", {"vault": vid, "query": queries[qid][:1000], "mode": "vector", "limit": 100})["results"]
            ranked: list[str] = []
            for item in res:
                d = rid_to_doc.get(item["record_id"])
                if d and d not in ranked:
                    ranked.append(d)
            nd.append(ndcg_at(ranked, rel))
            rc.append(recall_at(ranked, rel))
        return {"variant": variant, "ndcg@10": round(statistics.fmean(nd), 4), "recall@100": round(statistics.fmean(rc), 4), "queries": len(nd)}
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--split", default="test")
    args = ap.parse_args()
    corpus = load_jsonl(args.dataset / "corpus.jsonl")
    queries = {q["_id"]: q["text"] for q in load_jsonl(args.dataset / "queries.jsonl")}
    qrels = load_qrels(args.dataset / "qrels" / f"{args.split}.tsv")
    out = [run(v, corpus, queries, qrels, args.model_dir) for v in ("stem_ignored", "stem_as_title")]
    for o in out:
        print(json.dumps({"dataset": args.dataset.name, "model_dir": args.model_dir, **o}), flush=True)
    print(json.dumps({"stem_as_title_minus_ignored_ndcg@10": round(out[1]["ndcg@10"] - out[0]["ndcg@10"], 4)}))


if __name__ == "__main__":
    main()
