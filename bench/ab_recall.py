#!/usr/bin/env python3
"""No-regression A/B of retrieval between two commits, measured in the same run.

A (the reference, default f7aabb9) and B (the candidate, default the tip of ``main`` in --repo) are
each extracted with ``git archive`` into --work and run by this interpreter from their own folder
(``python -m`` imports the package of the working directory, and the daemon starts its processes
from the folder it was imported from: each commit runs its own code end to end). The run prints one
JSON object: A's and B's figures, B−A deltas and B/A ratios, and pass/fail per target:

- SciFact (300 test queries) and XQuAD-zh (1,181 queries) nDCG@10, hybrid with every other setting
  left to the commit's defaults, both as `rag search` shows it (one hit per document, ``--limit 10``)
  and as bench/eval_beir.py's table ranks (``--fragments``, documents by their best of 100
  fragments): B ≥ A − 0.003;
- `rag search` p50 through the daemon on SciFact and on the captured LoCoMo dev conversations
  (their category 1-4 questions): B/A ≤ 1.3. A and B run side by side, each query on both, in
  alternating order, so a load change on the machine hits both;
- embedding cost per conversation turn (turn windows included) of a fresh ``memory capture`` of each
  LoCoMo dev file: the model tokens embedded per turn, B/A ≤ 1.2. Deterministic: the texts are read
  on the model process's socket (bench/ab_tap.py) and counted by the model's tokenizer. Model
  seconds and model-process CPU seconds per turn are printed beside it (captures in ABBA order).

The BEIR vaults are not embedded again per commit: one Memories home per dataset is prepared once
in --homes (with A's bench/eval_beir.py when missing: SciFact with EmbeddingGemma fp32 takes one to
one and a half hours on 2 cores) and copied for each commit. A commit whose fragmenting differs
embeds its new fragments on the copy: ``vectors_missing`` says how many (a finding in itself).

    nice -n 10 .venv/bin/python -m bench.ab_recall --b main --homes HOMES \\
        --model-dir ../egemma/out/embeddinggemma-300m-fp32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ab_tap import EmbedTap
from bench.eval_beir import PASSPHRASE, Conn, load_jsonl, load_qrels, ndcg_at, start_daemon
from bench.eval_conversations import CATEGORIES, sessions

NDCG_TOLERANCE = 0.003
P50_RATIO = 1.3
EMBED_RATIO = 1.2
BEIR_SETS = ("scifact", "xquad-zh")


@dataclass
class Side:
    """One commit under test: ``role`` a or b, its full hash, the folder its tree was extracted to."""

    role: str
    commit: str
    code: Path


@dataclass
class Daemon:
    """One commit's daemon on one home, and the vault measured in it."""

    side: Side
    home: Path
    proc: subprocess.Popen[bytes]
    conn: Conn
    vault: str = ""

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """One request; once more on fresh connections when the daemon had closed ours (it closes a
        connection idle for ``[daemon] idle_timeout_seconds``, with nothing in flight: nothing ran)."""
        try:
            return self.conn.call(method, params)
        except OSError:
            for s in self.conn.socks.values():
                s.close()
            self.conn.socks.clear()
            self.conn.routes.clear()
            return self.conn.call(method, params)

    def create(self, name: str) -> str:
        """A new vault, made the measured one. Conn keeps the route of ``{"new": true}``, which is the
        process of the vault created last: a second create must ask for a fresh one."""
        self.conn.routes.clear()
        self.vault = str(self.call("vault.create", {"name": name, "passphrase": PASSPHRASE})["vault_id"])
        return self.vault

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def say(msg: str) -> None:
    print(f"[ab_recall {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def checkout(repo: Path, role: str, rev: str, work: Path) -> Side:
    """``rev``'s tree extracted under ``work`` (kept between runs: a commit's tree never changes)."""
    commit = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    code = work / f"code-{role}-{commit[:12]}"
    if not (code / "memoriesd").is_dir():
        shutil.rmtree(code, ignore_errors=True)
        code.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(code)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {commit} failed")
    where = subprocess.run(
        [sys.executable, "-c", "import memoriesd, memories_cli; print(memoriesd.__file__)"],
        cwd=code,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not where.startswith(str(code)):
        raise SystemExit(
            f"{code} runs memoriesd from {where}: run this with a venv whose memoriesd is not installed there"
        )
    return Side(role, commit, code)


def launch(side: Side, home: Path, model_dir: str, n_docs: int) -> Daemon:
    proc = start_daemon(home, model_dir, n_docs, code=side.code)
    return Daemon(side, home, proc, Conn(home / "run" / "memoriesd.sock"))


def index_all(d: Daemon) -> float:
    """``rag index`` until nothing is left to embed; its seconds."""
    t0 = time.perf_counter()
    while d.call("rag.index", {"vault": d.vault})["remaining"]:
        pass
    return time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


def search(d: Daemon, params: dict[str, Any]) -> list[dict[str, Any]]:
    """``rag.search``'s results; none for a query the daemon refuses (as bench/eval_beir.py counts it)."""
    try:
        return list(d.call("rag.search", params)["results"])
    except RuntimeError as exc:
        if "query_invalid" not in str(exc):
            raise
        return []


def paired_ratio(lat: dict[str, list[float]]) -> float:
    """The median of B/A over the same queries (each query ran on both, one after the other)."""
    return round(statistics.median(b / a for a, b in zip(lat["a"], lat["b"], strict=True) if a > 0), 3)


def paired(
    daemons: list[Daemon], items: list[tuple[str, str]], each: Callable[[Daemon, str, str], None]
) -> None:
    """``each(daemon, id, text)`` for every item on every daemon, the order alternating item by item."""
    for i, (qid, text) in enumerate(items):
        for d in daemons if i % 2 == 0 else daemons[::-1]:
            each(d, qid, text)
        if (i + 1) % 200 == 0:
            say(f"{i + 1} of {len(items)} queries")


def copy_home(src: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    shutil.rmtree(dest / "run", ignore_errors=True)  # sockets of the daemon that prepared it
    return dest


def prepare_home(side: Side, dataset: Path, home: Path, model_dir: str) -> None:
    """The dataset ingested and embedded once in ``home`` by ``side``'s own bench/eval_beir.py."""
    say(f"preparing {home} ({dataset.name}, commit {side.commit[:9]}): this embeds the whole corpus once")
    argv = [
        sys.executable,
        "-m",
        "bench.eval_beir",
        str(dataset),
        "--model-dir",
        model_dir,
        "--home",
        str(home),
    ]
    argv += "--mode hybrid --max-queries 1 --grouping documents".split()
    subprocess.run(argv, cwd=side.code, check=True, stdout=subprocess.DEVNULL)


def beir(
    sides: list[Side], dataset: Path, prepared: Path, work: Path, model_dir: str, max_queries: int | None
) -> dict[str, Any]:
    """nDCG@10 (default search, and --fragments) and latency of hybrid `rag search` on both commits."""
    if (prepared / "run" / "memoriesd.sock").exists():
        raise SystemExit(
            f"a daemon runs on {prepared} (still being prepared?): copy it once that one has stopped"
        )
    if not (prepared / "eval-records.json").exists():
        prepare_home(sides[0], dataset, prepared, model_dir)
    n_docs = sum(1 for _ in (dataset / "corpus.jsonl").open(encoding="utf-8"))
    queries = {q["_id"]: q["text"] for q in load_jsonl(dataset / "queries.jsonl")}
    qrels = load_qrels(dataset / "qrels" / "test.tsv")
    qids = [q for q in qrels if q in queries][:max_queries]
    daemons: list[Daemon] = []
    out: dict[str, Any] = {"queries": len(qids), "documents": n_docs, "home": str(prepared)}
    try:
        for side in sides:
            d = launch(side, copy_home(prepared, work / f"{side.role}-{dataset.name}"), model_dir, n_docs)
            daemons.append(d)
            d.vault = d.call("vault.list", {})["vaults"][0]["vault_id"]
            d.call("vault.unlock", {"vault": d.vault, "passphrase": PASSPHRASE})
            d.call("rag.search", {"vault": d.vault, "query": "index warm-up", "mode": "bm25", "limit": 1})
            emb = d.call("rag.status", {"vault": d.vault})
            e = emb.get("embedding") or {}
            missing = (
                (e["total"] - e["embedded"])
                if isinstance(e.get("total"), int) and isinstance(e.get("embedded"), int)
                else None
            )
            if side.role == "a" and missing:
                raise SystemExit(
                    f"{prepared} lacks {missing} vectors of commit A: finish it first (bench/eval_beir.py "
                    f"{dataset} --mode hybrid --model-dir M --home {prepared} --max-queries 1)"
                )
            if missing:
                say(
                    f"{side.role}: {missing} vectors of {dataset.name} to embed on the copy (its fragments changed)"
                )
            out[side.role] = {
                "fragments": emb.get("fragments"),
                "vectors": e.get("total"),
                "vectors_missing": missing,
                "index_seconds": round(index_all(d), 2),
            }
            d.call("rag.search", {"vault": d.vault, "query": "vector warm-up", "mode": "hybrid", "limit": 1})
        rid_to_doc = {d.side.role: json.loads((d.home / "eval-records.json").read_text()) for d in daemons}
        shown: dict[str, dict[str, list[str]]] = {d.side.role: {} for d in daemons}
        frags: dict[str, dict[str, list[str]]] = {d.side.role: {} for d in daemons}
        lat: dict[str, list[float]] = {d.side.role: [] for d in daemons}

        def docs(role: str, results: list[dict[str, Any]]) -> list[str]:
            ranked: list[str] = []
            for item in results:
                doc = rid_to_doc[role].get(item["record_id"])
                if doc and doc not in ranked:
                    ranked.append(doc)
            return ranked

        def one(d: Daemon, qid: str, text: str) -> None:
            role = d.side.role
            base = {"vault": d.vault, "query": text[:1000], "mode": "hybrid"}
            t0 = time.perf_counter()
            shown[role][qid] = docs(role, search(d, base | {"limit": 10}))
            lat[role].append((time.perf_counter() - t0) * 1000)
            frags[role][qid] = docs(role, search(d, base | {"limit": 100, "fragments": True}))

        paired(daemons, [(q, queries[q]) for q in qids], one)
        for d in daemons:
            role = d.side.role
            out[role] |= {
                "ndcg@10": round(statistics.fmean(ndcg_at(shown[role][q], qrels[q]) for q in qids), 4),
                "ndcg@10_fragments": round(
                    statistics.fmean(ndcg_at(frags[role][q], qrels[q]) for q in qids), 4
                ),
                "p50_ms": percentile(lat[role], 0.5),
                "p95_ms": percentile(lat[role], 0.95),
            }
        a, b = out["a"], out["b"]
        same = sum(shown["a"][q] == shown["b"][q] for q in qids)
        out["delta"] = {k: round(b[k] - a[k], 4) for k in ("ndcg@10", "ndcg@10_fragments")}
        out["p50_ratio"] = round(b["p50_ms"] / a["p50_ms"], 3)
        out["paired_ratio_median"] = paired_ratio(lat)
        out["same_top10_queries"] = same
    finally:
        for d in daemons:
            d.stop()
    return out


def capture(d: Daemon, tap: EmbedTap, path: Path, turns: int) -> dict[str, Any]:
    """A fresh ``memory capture`` of one LoCoMo file (the commit's own CLI), embedded to the end."""
    d.create(f"conv-{path.stem}")
    cpu0 = tap.cpu_seconds()
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "memories_cli.main", "memory", "capture", d.vault, str(path)]
    argv += "--format locomo --no-extract --json".split()
    env = dict(os.environ, MEMORIES_HOME=str(d.home))
    proc = subprocess.run(argv, env=env, cwd=d.side.code, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{d.side.role}: memory capture {path.name}: {proc.stderr.strip()}")
    d.call("rag.search", {"vault": d.vault, "query": "warm up", "mode": "bm25", "limit": 1})
    index_all(d)
    wall = time.perf_counter() - t0
    cpu1 = tap.cpu_seconds()
    return {
        "vault": d.vault,
        "turns": turns,
        "records": len(json.loads(proc.stdout)["records"]),
        "capture_and_embed_seconds": round(wall, 2),
        "model_cpu_seconds": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
    }


def conversations(
    sides: list[Side], folder: Path, work: Path, model_dir: str, max_queries: int | None
) -> dict[str, Any]:
    """Embedding cost per turn of a fresh capture, and `rag search` latency on the captured vaults."""
    files = sorted(folder.glob("*.json"))
    data = {p: json.loads(p.read_text(encoding="utf-8")) for p in files}
    daemons: list[Daemon] = []
    taps: dict[str, EmbedTap] = {}
    per: dict[str, dict[str, dict[str, Any]]] = {s.role: {} for s in sides}
    vaults: dict[str, dict[Path, str]] = {s.role: {} for s in sides}
    out: dict[str, Any] = {"files": [p.name for p in files]}
    try:
        for side in sides:
            home = work / f"{side.role}-locomo"
            shutil.rmtree(home, ignore_errors=True)
            d = launch(side, home, model_dir, 1000)
            daemons.append(d)
            # The model process starts on a vault's first embedding: a one-record vault starts it before the tap.
            d.create("warm")
            d.call("memory.add", {"vault": d.vault, "title": "warm", "body": "warm up the model", "tags": []})
            index_all(d)
            taps[side.role] = tap = EmbedTap(home / "run")
            tap.install()
        for i, path in enumerate(files):  # ABBA: each commit captures first once
            turns = sum(len(t) for _, _, t in sessions(data[path]))
            for d in daemons if i % 2 == 0 else daemons[::-1]:
                say(f"{d.side.role}: capturing {path.name}")
                per[d.side.role][path.name] = capture(d, taps[d.side.role], path, turns)
                vaults[d.side.role][path] = d.vault
        for d in daemons:
            role = d.side.role
            for row in per[role].values():
                row |= taps[role].summary(row.pop("vault"))
            rows = list(per[role].values())
            turns = sum(r["turns"] for r in rows)
            cpu = [r["model_cpu_seconds"] for r in rows]
            out[role] = {
                "per_file": per[role],
                "turns": turns,
                "texts_per_turn": round(sum(r["texts"] for r in rows) / turns, 4),
                "tokens_per_turn": round(sum(r["tokens"] for r in rows) / turns, 2),
                "model_seconds_per_turn": round(sum(r["model_seconds"] for r in rows) / turns, 4),
                "model_cpu_seconds_per_turn": None if None in cpu else round(sum(cpu) / turns, 4),
                "tap_bypassed": taps[role].bypassed(),
            }
        lat: dict[str, list[float]] = {s.role: [] for s in sides}

        asked = [
            (p, str(q["question"]))
            for p in files
            for q in data[p].get("qa", [])
            if CATEGORIES.get(int(q.get("category", 0)))
        ][:max_queries]
        questions = [(str(j), text) for j, (_, text) in enumerate(asked)]

        def one(d: Daemon, qid: str, text: str) -> None:
            vault = vaults[d.side.role][asked[int(qid)][0]]
            t0 = time.perf_counter()
            d.call("rag.search", {"vault": vault, "query": text, "mode": "hybrid", "limit": 10})
            lat[d.side.role].append((time.perf_counter() - t0) * 1000)

        for d in daemons:  # the captured vaults' vectors loaded before timing
            for vault in vaults[d.side.role].values():
                d.call("rag.search", {"vault": vault, "query": "warm up", "mode": "hybrid", "limit": 1})
        paired(daemons, questions, one)
        for d in daemons:
            out[d.side.role] |= {
                "questions": len(questions),
                "search_p50_ms": percentile(lat[d.side.role], 0.5),
                "search_p95_ms": percentile(lat[d.side.role], 0.95),
            }
        a, b = out["a"], out["b"]
        out["search_paired_ratio_median"] = paired_ratio(lat)
        out["ratio"] = {
            k: None if not a.get(k) or b.get(k) is None else round(b[k] / a[k], 3)
            for k in (
                "texts_per_turn",
                "tokens_per_turn",
                "model_seconds_per_turn",
                "model_cpu_seconds_per_turn",
                "search_p50_ms",
            )
        }
    finally:
        for tap in taps.values():
            tap.close()
        for d in daemons:
            d.stop()
    return out


def verdict(result: dict[str, Any]) -> dict[str, bool | None]:
    """Pass/fail of each target (None: not measured in this run)."""
    checks: dict[str, bool | None] = {}
    for name in BEIR_SETS:
        r = result.get(name)
        checks[f"{name}_ndcg"] = None if r is None else min(r["delta"].values()) >= -NDCG_TOLERANCE
    sci = result.get("scifact")
    checks["scifact_search_p50"] = None if sci is None else sci["p50_ratio"] <= P50_RATIO
    conv = result.get("locomo")
    checks["locomo_search_p50"] = None if conv is None else conv["ratio"]["search_p50_ms"] <= P50_RATIO
    checks["locomo_embed_tokens_per_turn"] = (
        None if conv is None else conv["ratio"]["tokens_per_turn"] <= EMBED_RATIO
    )
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[1], help="the git repository holding both commits (default: this clone)"
    )
    ap.add_argument("--a", default="f7aabb9", help="the reference commit (default: f7aabb9)")
    ap.add_argument("--b", default="main", help="the candidate commit (default: main of --repo)")
    ap.add_argument("--model-dir", required=True, help="EmbeddingGemma (fp32 export: ../shared/tools/egemma/build.sh)")
    ap.add_argument(
        "--eval-dir",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "eval",
        help="holds scifact/, xquad-zh/, locomo-dev/",
    )
    ap.add_argument(
        "--homes",
        type=Path,
        required=True,
        help="one prepared Memories home per BEIR set (HOMES/scifact, HOMES/xquad-zh), made when missing",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/ab-recall"),
        help="checkouts and per-commit copies of the homes",
    )
    ap.add_argument(
        "--only", action="append", choices=[*BEIR_SETS, "locomo"], help="measure only this (repeatable)"
    )
    ap.add_argument(
        "--max-queries", type=int, default=None, help="fewer queries per set (a quick check of the script)"
    )
    args = ap.parse_args()
    parts = args.only or [*BEIR_SETS, "locomo"]
    args.work.mkdir(parents=True, exist_ok=True)
    args.homes.mkdir(parents=True, exist_ok=True)
    sides = [checkout(args.repo, "a", args.a, args.work), checkout(args.repo, "b", args.b, args.work)]
    say(f"A {sides[0].commit[:12]}  B {sides[1].commit[:12]}")
    result: dict[str, Any] = {
        "a": sides[0].commit,
        "b": sides[1].commit,
        "model_dir": args.model_dir,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    t0 = time.perf_counter()
    for name in parts:
        say(f"measuring {name}")
        if name == "locomo":
            result[name] = conversations(
                sides, args.eval_dir / "locomo-dev", args.work, args.model_dir, args.max_queries
            )
        else:
            result[name] = beir(
                sides, args.eval_dir / name, args.homes / name, args.work, args.model_dir, args.max_queries
            )
        print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["targets"] = verdict(result)
    result["pass"] = all(v is not False for v in result["targets"].values())
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
