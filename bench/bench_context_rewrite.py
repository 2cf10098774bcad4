#!/usr/bin/env python3
"""What query rewriting costs a context pack (``rag context --rewrite``), through the real daemon.

No language model runs here, so this measures the machinery, not the quality of a model's
rewrites: a stand-in chat server on 127.0.0.1 (OpenAI-compatible, answering at once) plays the
``[generation]`` service with one of three rewriters, and every LoCoMo question (categories 1-4)
of each file in DIR gets a pack without rewriting and one with each rewriter, in the same run, in
turn (after an uncounted pack that puts the question's vector in the query cache for all of them):

- ``echo``: replies with the question itself (nothing new to search): the cost of the round trip;
- ``split``: the question cut at commas and at " and " (parts of two words or more; one part: the
  question), a naive decomposition;
- ``halves``: the question's words cut in two halves, two queries for every question: the cost
  of three searches and what a poor rewriter does to a pack.

Prints one JSON object per file and rewriter: the pack's wall time through the socket (median and
p90, and the median of the paired difference against no rewriting), the mean number of queries
searched, used tokens, and pack_any / pack_all (some / every evidence turn in the pack, as
``bench/eval_conversations.py`` counts them) with the questions won and lost against no rewriting.

    python -m bench.bench_context_rewrite ../shared/eval/locomo-dev
    python -m bench.bench_context_rewrite ../shared/eval/locomo-dev --model-dir ../shared/models/all-MiniLM-L6-v2-onnx

bm25 takes about a minute for the two dev files on 2 cores; with MiniLM add the embedding (~2 min).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import Conn, launch_daemon  # noqa: E402
from bench.eval_conversations import CATEGORIES, capture_vault, pack_turns  # noqa: E402

REWRITERS = ("echo", "split", "halves")
_QUESTION = re.compile(r"<question>(.*)</question>", re.DOTALL)


def rewrite(kind: str, question: str) -> list[str]:
    """The stand-in rewriters of the module docstring."""
    q = question.strip().rstrip("?").strip()
    if kind == "split":
        parts = [p.strip() for p in re.split(r",|\band\b", q) if len(p.split()) >= 2]
        return parts[:4] if len(parts) > 1 else [question]
    if kind == "halves":
        words = q.split()
        if len(words) < 2:
            return [question]
        mid = len(words) // 2
        return [" ".join(words[:mid]), " ".join(words[mid:])]
    return [question]


class StandIn(ThreadingHTTPServer):
    """A chat-completions server on 127.0.0.1 whose rewriter the run switches."""

    daemon_threads = True

    def __init__(self) -> None:
        self.kind = "echo"
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        m = _QUESTION.search(body["messages"][-1]["content"])
        question = html.unescape(m.group(1)) if m else ""
        self.server.requests += 1
        content = json.dumps({"queries": rewrite(self.server.kind, question)})
        data = json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ]
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _config(home: Path, url: str, model_dir: str | None) -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = [
        "[vault]\nkdf_memory_kib = 65536\nkdf_iterations = 3\nkdf_lanes = 4\n",
        "[daemon]\nauto_lock_minutes = 0\n",
        "[index]\nbudget_seconds = 3600\n",
        "[search]\non_demand_embed_limit = 0\n",
        f'[generation]\nprotocol = "compatible"\nurl = "{url}"\nmodel = "stand-in"\n',
    ]
    if model_dir:
        cfg.append(f'[embedding.local]\nmodel_dir = "{Path(model_dir).resolve()}"\n')
    (home / "config.toml").write_text("".join(cfg))


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


def run_file(
    conn: Conn, server: StandIn, vid: str, spans: Any, qa: list[dict[str, Any]], budget: int, mode: str
) -> list[dict[str, Any]]:
    questions = []
    for q in qa:
        if CATEGORIES.get(int(q.get("category", 0))) is None:
            continue
        evidence = {str(e) for e in q.get("evidence", [])} & spans.known
        if evidence:
            questions.append((str(q["question"]), evidence))
    kinds = ("off", *REWRITERS)
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for n, (question, evidence) in enumerate(questions):
        # Uncounted first: the question's vector is then in the query cache for every variant alike.
        conn.call(
            "rag.context", {"vault": vid, "query": question, "budget": budget, "mode": mode, "rewrite": False}
        )
        for kind in kinds[n % len(kinds) :] + kinds[: n % len(kinds)]:  # interleaved, each first in turn
            server.kind = kind
            params = {
                "vault": vid,
                "query": question,
                "budget": budget,
                "mode": mode,
                "rewrite": kind != "off",
            }
            t0 = time.perf_counter()
            pack = conn.call("rag.context", params)
            ms = (time.perf_counter() - t0) * 1000
            got = pack_turns(spans, pack["items"])
            rows[kind].append(
                {
                    "ms": ms,
                    "queries": float(len(pack.get("queries") or [question])),
                    "tokens": float(pack["used_tokens"]),
                    "items": float(len(pack["items"])),
                    "any": float(bool(evidence & got)),
                    "all": float(evidence <= got),
                    "notices": float(len(pack.get("notices") or [])),
                }
            )
    out = []
    base = rows["off"]
    for kind, rs in rows.items():
        rec: dict[str, Any] = {
            "rewriter": kind,
            "questions": len(rs),
            "p50_ms": _pct([r["ms"] for r in rs], 0.5),
            "p90_ms": _pct([r["ms"] for r in rs], 0.9),
        }
        for key in ("queries", "tokens", "items", "any", "all", "notices"):
            rec[f"mean_{key}"] = round(statistics.fmean(r[key] for r in rs), 4)
        if kind != "off":
            rec["paired_extra_ms_p50"] = _pct([r["ms"] - b["ms"] for r, b in zip(rs, base, strict=True)], 0.5)
            for key in ("any", "all"):
                rec[f"{key}_won_lost"] = [
                    sum(r[key] > b[key] for r, b in zip(rs, base, strict=True)),
                    sum(r[key] < b[key] for r, b in zip(rs, base, strict=True)),
                ]
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="a folder of LoCoMo-format .json files")
    ap.add_argument("--model-dir", default=None, help="a local embedding model (hybrid packs); default bm25")
    ap.add_argument("--budget", type=int, default=1000)
    args = ap.parse_args()
    files = sorted(args.dir.glob("*.json"))
    if not files:
        ap.error(f"no .json files in {args.dir}")
    mode = "hybrid" if args.model_dir else "bm25"
    server = StandIn()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="mrw", dir="/tmp"))
    home = tmp / "h"
    _config(home, f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions", args.model_dir)
    proc = launch_daemon(home)
    try:
        for path in files:
            conn = Conn(
                home / "run" / "memoriesd.sock"
            )  # a new vault's route is asked afresh (Conn keeps routes)
            data = json.loads(path.read_text(encoding="utf-8"))
            vid, spans, _stats = capture_vault(conn, home, path)
            if args.model_dir:
                while conn.call("rag.index", {"vault": vid})["remaining"]:
                    pass
            conn.call("rag.context", {"vault": vid, "query": "warm up", "budget": 100, "mode": mode})
            print(f"{path.stem}: {len(data.get('qa', []))} questions", file=sys.stderr, flush=True)
            for rec in run_file(conn, server, vid, spans, list(data.get("qa", [])), args.budget, mode):
                print(json.dumps({"set": path.stem, "mode": mode, "budget": args.budget, **rec}), flush=True)
        print(json.dumps({"stand_in_requests": server.requests}), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
