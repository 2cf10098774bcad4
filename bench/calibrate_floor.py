#!/usr/bin/env python3
"""Calibrate `rag ask`'s evidence floor (`[rag] ask_min_cosine`) for an embedding model.

For each vault kept by ``bench/eval_beir.py --home DIR`` (one per dataset, already embedded with
the model), the best vector cosine of every *on-topic* question (the dataset's own queries) and of
every *off-topic* question (the other datasets' queries) is read through the real daemon
(`rag search --mode vector --limit 1`). For candidate floors it prints, as JSON, the share of
on-topic questions that keep evidence and of off-topic questions that are wrongly sent on.

    python -m bench.calibrate_floor --model-dir DIR \\
        --set scifact=/work/evalhome-scifact-gemma:../shared/eval/scifact \\
        --set xquad-zh=/work/evalhome-xquad-gemma:../shared/eval/xquad-zh
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import PASSPHRASE, Conn, load_jsonl, start_daemon  # noqa: E402


def best_cosines(home: Path, model_dir: str, questions: list[str]) -> list[float]:
    proc = start_daemon(home, model_dir, 0)
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        vid = conn.call("vault.list", {})["vaults"][0]["vault_id"]
        conn.call("vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
        out = []
        for q in questions:
            res = conn.call("rag.search", {"vault": vid, "query": q[:1000], "mode": "vector", "limit": 1})["results"]
            out.append(float(res[0]["cosine"]) if res else -1.0)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def share_at_least(values: list[float], floor: float) -> float:
    return round(sum(1 for v in values if v >= floor) / max(1, len(values)), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--set", action="append", required=True, help="NAME=EVAL_HOME:DATASET_DIR (repeat for two or more)")
    ap.add_argument("--max-queries", type=int, default=300)
    ap.add_argument("--floors", default="0.2,0.25,0.3,0.35,0.4,0.45,0.5")
    args = ap.parse_args()
    sets: dict[str, tuple[Path, list[str]]] = {}
    for spec in args.set:
        name, rest = spec.split("=", 1)
        home, data = rest.split(":", 1)
        qs = [q["text"] for q in load_jsonl(Path(data) / "queries.jsonl")][: args.max_queries]
        sets[name] = (Path(home), qs)
    report: dict[str, Any] = {"model_dir": args.model_dir, "sets": {}}
    on_all: list[float] = []
    off_all: list[float] = []
    for name, (home, own) in sets.items():
        others = [q for other, (_, qs) in sets.items() if other != name for q in qs]
        on = best_cosines(home, args.model_dir, own)
        off = best_cosines(home, args.model_dir, others)
        on_all += on
        off_all += off
        report["sets"][name] = {
            "on_topic_median": round(statistics.median(on), 4),
            "off_topic_median": round(statistics.median(off), 4),
            "off_topic_max": round(max(off), 4),
        }
    floors = [float(f) for f in args.floors.split(",")]
    report["floors"] = [
        {"floor": f, "on_topic_kept": share_at_least(on_all, f), "off_topic_sent": share_at_least(off_all, f)} for f in floors
    ]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
