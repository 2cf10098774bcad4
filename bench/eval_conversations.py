#!/usr/bin/env python3
"""Recall of conversation memory on LoCoMo-format files, through the real daemon and the CLI.

Each ``*.json`` file in DIR (LoCoMo layout: ``speaker_a``, ``session_N``, ``session_N_date_time``,
``qa``; see ../shared/eval/README.md) goes into its own vault with ``memories memory capture FILE
--format locomo`` (one conversation record per session). For every question of categories 1-4 and
every mode, ``rag search --limit 10`` and ``rag context --budget B`` run through the daemon's socket
(the methods the CLI calls) and the evidence turns (``dia_id``) are looked up in what came back:

- recall_any@5 / recall_any@10: some evidence turn is in the top 5 / 10 fragments;
- recall_all@10: every evidence turn is in the top 10 fragments;
- pack_any / pack_all: some / every evidence turn is in the token-budgeted context pack.

A turn counts as returned when a result covers at least half of its bytes. ``--baseline`` runs the
same questions against the note-per-session alternative in the same run: each session written as a
Markdown note (``# title`` + ``Speaker: text`` lines) and ``rag ingest``-ed, as a person would
without capture.

    python -m bench.eval_conversations ../shared/eval/locomo-dev --mode bm25 --baseline
    python -m bench.eval_conversations ../shared/eval/locomo-dev --model-dir DIR --mode bm25 --mode vector --mode hybrid

Prints one JSON object per (set, path, mode) with the figures overall and per category, and one per
file with capture throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import PASSPHRASE, Conn, start_daemon  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "inference", 4: "single-hop"}
_SESSION = re.compile(r"^session_(\d+)$")


@dataclass
class Spans:
    """Where each LoCoMo turn (``dia_id``) sits in the vault: record id -> [(start, end, dia_id)]."""

    by_record: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)

    def add(self, record_id: str, start: int, end: int, ref: str) -> None:
        self.by_record.setdefault(record_id, []).append((start, end, ref))
        self.known.add(ref)

    def covered(self, record_id: str, start: int | None, end: int | None, text: str | None = None) -> set[str]:
        """The turns a result covers (at least half of a turn's bytes)."""
        out: set[str] = set()
        if start is None or end is None:
            return out
        for s, e, ref in self.by_record.get(record_id, ()):
            overlap = min(e, end) - max(s, start)
            if overlap > 0 and overlap * 2 >= (e - s):
                out.add(ref)
        return out


def sessions(conv: dict[str, Any]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    out = []
    for key, turns in conv.items():
        m = _SESSION.match(key)
        if m and isinstance(turns, list):
            n = int(m.group(1))
            out.append((n, str(conv.get(f"session_{n}_date_time", "")), turns))
    return sorted(out)


def cli(home: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, MEMORIES_HOME=str(home))
    proc = subprocess.run([sys.executable, "-m", "memories_cli.main", *args, "--json"], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"memories {' '.join(args[:2])}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def existing_vault(conn: Conn, name: str) -> str | None:
    for v in conn.call("vault.list", {})["vaults"]:
        if v["name"] == name:
            conn.call("vault.unlock", {"vault": v["vault_id"], "passphrase": PASSPHRASE})
            return str(v["vault_id"])
    return None


def capture_vault(conn: Conn, home: Path, path: Path) -> tuple[str, Spans, dict[str, Any]]:
    """``memories memory capture`` of a LoCoMo file into a new vault (or the vault of an earlier run
    in the same ``--home``, whose sealed vectors are reused); turn spans from the records' metadata."""
    vid = existing_vault(conn, f"conv-{path.stem}")
    if vid is None:
        vid = conn.call("vault.create", {"name": f"conv-{path.stem}", "passphrase": PASSPHRASE})["vault_id"]
    t0 = time.perf_counter()
    out = cli(home, "memory", "capture", vid, str(path), "--format", "locomo", "--no-extract")
    seconds = time.perf_counter() - t0
    spans = Spans()
    n_turns = 0
    for rec in out["records"]:
        full = conn.call("memory.read", {"vault": vid, "id": rec["id"]})
        for t in (full.get("meta") or {}).get("conversation", {}).get("turns", []):
            start, end, _speaker, _time, ref = t
            n_turns += 1
            if ref:
                spans.add(rec["id"], int(start), int(end), str(ref))
    stats = {"records": len(out["records"]), "turns": n_turns, "capture_seconds": round(seconds, 3),
             "turns_per_second": round(n_turns / seconds, 1) if seconds else None}
    return vid, spans, stats


def notes_vault(conn: Conn, home: Path, path: Path, data: dict[str, Any]) -> tuple[str, Spans]:
    """The alternative: one Markdown note per session, ``rag ingest``-ed."""
    vid = existing_vault(conn, f"notes-{path.stem}")
    if vid is None:
        vid = conn.call("vault.create", {"name": f"notes-{path.stem}", "passphrase": PASSPHRASE})["vault_id"]
    folder = home / f"notes-{path.stem}"
    folder.mkdir(exist_ok=True)
    a, b = data.get("speaker_a", "A"), data.get("speaker_b", "B")
    layout: dict[str, list[tuple[str, str]]] = {}
    for n, when, turns in sessions(data):
        lines = []
        for t in turns:
            text = " ".join(str(t.get("text", "")).split())
            if t.get("blip_caption"):
                text += f" [shares a photo: {t['blip_caption']}]"
            lines.append((str(t.get("dia_id", "")), f"{t.get('speaker', '?')}: {text}"))
        name = f"session-{n:02d}.md"
        (folder / name).write_text(f"# {a} and {b}, session {n} ({when})\n\n" + "\n\n".join(t for _, t in lines) + "\n",
                                   encoding="utf-8")
        layout[name] = lines
    report = conn.call("rag.ingest", {"vault": vid, "paths": [str(folder.resolve())], "recursive": True})
    spans = Spans()
    for r in report["records"]:
        name = Path(r.get("path", "")).name
        if name not in layout:
            continue
        body = conn.call("memory.read", {"vault": vid, "id": r["id"]})["body"]
        data_b = body.encode("utf-8")
        pos = 0
        for ref, line in layout[name]:
            i = data_b.find(line.encode("utf-8"), pos)
            if i < 0:
                continue
            spans.add(r["id"], i, i + len(line.encode("utf-8")), ref)
            pos = i + 1
    return vid, spans


def embed_all(conn: Conn, vid: str) -> tuple[float, int]:
    """``rag.index`` until no fragment (nor turn window) lacks a vector: seconds and vectors made.
    Vectors sealed by an earlier daemon on the same home are loaded, not made again (0 made)."""
    t0 = time.perf_counter()
    embedded = 0
    while True:
        out = conn.call("rag.index", {"vault": vid})
        embedded += int(out.get("embedded", 0))
        if not out["remaining"] or not out.get("embedded", 1):  # done, or a pass that made nothing (stuck)
            return time.perf_counter() - t0, embedded


def pack_turns(spans: Spans, items: list[dict[str, Any]]) -> set[str]:
    got: set[str] = set()
    for it in items:
        got |= spans.covered(it["record_id"], it.get("start"), it.get("end"))
    return got


_DUMP = open(os.environ["EVAL_DUMP"], "a") if os.environ.get("EVAL_DUMP") else None  # noqa: SIM115

#: The 0/1 figures of one question, in the order of the issue's table.
METRICS = ("recall_any@5", "recall_any@10", "recall_all@10", "pack_any", "pack_all")


@dataclass(frozen=True)
class QuestionRow:
    """One question's outcome in one vault, mode and daemon configuration: what the averages and the
    paired comparisons (``bench.conversation_report``) are made of. ``index`` is the question's
    position in the file's ``qa`` list, so two runs of the same file pair up by ``(file, index)``."""

    file: str
    index: int
    category: str
    evidence: int  # evidence turns found in the vault
    scores: dict[str, float]  # METRICS -> 1.0 (held) or 0.0
    pack_tokens: int
    search_ms: float


def score_rows(conn: Conn, vid: str, spans: Spans, qa: list[dict[str, Any]], mode: str, budget: int,
               file: str = "") -> tuple[list[QuestionRow], int]:
    """Every question of categories 1-4 whose evidence is in the vault, through ``rag.search``
    (limit 10, grouped by document: the CLI's request) and ``rag.context`` (``budget`` tokens);
    returns the rows and how many evidence ids named no turn of the vault."""
    rows: list[QuestionRow] = []
    unknown = 0
    for index, q in enumerate(qa):
        cat = CATEGORIES.get(int(q.get("category", 0)))
        if cat is None:
            continue
        evidence = {str(e) for e in q.get("evidence", [])}
        unknown += len(evidence - spans.known)
        evidence &= spans.known
        if not evidence:
            continue
        t0 = time.perf_counter()
        hits = conn.call("rag.search", {"vault": vid, "query": q["question"], "mode": mode, "limit": 10})["results"]
        search_ms = (time.perf_counter() - t0) * 1000
        top: list[set[str]] = [spans.covered(h["record_id"], h["start"], h["end"]) for h in hits]
        at5 = set().union(*top[:5]) if top else set()
        at10 = set().union(*top[:10]) if top else set()
        pack = conn.call("rag.context", {"vault": vid, "query": q["question"], "budget": budget, "mode": mode})
        in_pack = pack_turns(spans, pack["items"])
        scores = {
            "recall_any@5": float(bool(evidence & at5)),
            "recall_any@10": float(bool(evidence & at10)),
            "recall_all@10": float(evidence <= at10),
            "pack_any": float(bool(evidence & in_pack)),
            "pack_all": float(evidence <= in_pack),
        }
        rows.append(QuestionRow(file, index, cat, len(evidence), scores, int(pack["used_tokens"]), search_ms))
        if _DUMP is not None:
            row = {**scores, "pack_tokens": float(pack["used_tokens"])}
            _DUMP.write(json.dumps({"q": q["question"], "cat": cat, "evidence": sorted(evidence), "row": row,
                                    "top10": [sorted(t) for t in top],
                                    "pack": [{"rid": i["record_id"][:8], "s": i.get("start"), "e": i.get("end"),
                                              "tok": i["tokens"], "score": i["score"],
                                              "turns": sorted(spans.covered(i["record_id"], i.get("start"), i.get("end")))}
                                             for i in pack["items"]]}) + "\n")
    return rows, unknown


def summarize(rows: list[QuestionRow]) -> dict[str, dict[str, float]]:
    """Mean of each figure overall (``all``) and per category, with the question count."""
    per: dict[str, list[QuestionRow]] = {}
    for r in rows:
        per.setdefault(r.category, []).append(r)
        per.setdefault("all", []).append(r)
    out: dict[str, dict[str, float]] = {}
    for key, bucket in per.items():
        out[key] = {k: round(statistics.fmean(r.scores[k] for r in bucket), 4) for k in METRICS}
        out[key]["pack_tokens"] = round(statistics.fmean(r.pack_tokens for r in bucket), 4)
        out[key]["questions"] = len(bucket)
    return out


def score(conn: Conn, vid: str, spans: Spans, qa: list[dict[str, Any]], mode: str, budget: int) -> dict[str, Any]:
    rows, unknown = score_rows(conn, vid, spans, qa, mode, budget)
    lat = sorted(r.search_ms for r in rows)
    return {"by_category": summarize(rows), "search_p50_ms": round(lat[len(lat) // 2], 2) if lat else None,
            "unknown_evidence_ids": unknown}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="a folder of LoCoMo-format .json files")
    ap.add_argument("--mode", action="append", choices=["bm25", "vector", "hybrid"])
    ap.add_argument("--model-dir", default=None, help="a local embedding model directory (vector and hybrid modes)")
    ap.add_argument("--budget", type=int, default=1000, help="context pack budget in tokens")
    ap.add_argument("--baseline", action="store_true", help="also score one ingested Markdown note per session")
    ap.add_argument("--home", type=Path, default=None,
                    help="run in this Memories home and keep it: a later run reuses its vaults and sealed vectors "
                    "(capturing again is a no-op; a changed fragmenting re-embeds only the new fragments)")
    ap.add_argument("--no-windows", action="store_true",
                    help="[rag] conversation_windows = false: no turn-window vectors (the cost and gain of having them)")
    args = ap.parse_args()
    modes = args.mode or ["bm25"]
    if any(m != "bm25" for m in modes) and not args.model_dir:
        ap.error("--mode vector/hybrid needs --model-dir")
    files = sorted(args.dir.glob("*.json"))
    if not files:
        ap.error(f"no .json files in {args.dir}")
    tmp = Path(tempfile.mkdtemp(prefix="mconv", dir="/tmp")) if args.home is None else None
    home = (tmp / "h") if tmp is not None else args.home.resolve()
    proc = start_daemon(home, args.model_dir, 1000, rag_extra="conversation_windows = false\n" if args.no_windows else "")
    try:
        conn = Conn(home / "run" / "memoriesd.sock")
        for path in files:
            data = json.loads(path.read_text(encoding="utf-8"))
            qa = list(data.get("qa", []))
            paths: list[tuple[str, str, Spans]] = []
            vid, spans, stats = capture_vault(conn, home, path)
            paths.append(("capture", vid, spans))
            if args.baseline:
                nvid, nspans = notes_vault(conn, home, path, data)
                paths.append(("notes", nvid, nspans))
            for name, v, _ in paths:
                conn.call("rag.search", {"vault": v, "query": "warm up", "mode": "bm25", "limit": 1})
                if args.model_dir:
                    seconds, _embedded = embed_all(conn, v)
                    if name == "capture":
                        stats["embed_seconds"] = round(seconds, 2)
            print(json.dumps({"set": path.stem, "capture": stats}), flush=True)
            for name, v, sp in paths:
                for mode in modes:
                    res = score(conn, v, sp, qa, mode, args.budget)
                    print(json.dumps({"set": path.stem, "path": name, "mode": mode, "budget": args.budget, **res}),
                          flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
