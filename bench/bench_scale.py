#!/usr/bin/env python3
"""A vault at scale through the user's path: Markdown notes, `memories rag ingest`, search, unlock.

Prints one JSON object on stdout (progress on stderr). On a throw-away home with its own daemon:

1. writes Markdown notes from public text in ``../shared/eval/`` (SciFact abstracts, tldr pages in
   every language of the archive, XQuAD-zh paragraphs; repeated with distinct headings once the
   text runs out), about ``--note-kib`` each, and ingests them with the real CLI
   (``memories rag ingest VAULT DIR --recursive``) in steps until the vault holds each of
   ``--steps`` fragments (default 10,000 and 100,000). The first step is a 1,000-note folder;
2. at each step: ingest MB/s, the first search (builds the index), search p50/p95 per mode over
   SciFact and XQuAD-zh queries (daemon round trip and the daemon's own timings; with a model,
   query embedding is reported separately from the daemon's ``query_embed_ms``), the CLI
   p50 beside the process start of a no-op CLI call, unlock -> first search per mode (the vault is
   locked and unlocked before each mode), the daemon's RSS (``/proc``) after every action, and the
   sealed bytes on disk per fragment by file kind;
3. at the last step: re-ingest of the unchanged 1,000-note folder (beside its first ingest) and a
   one-line edit near the top of a 20-fragment note: fragments re-embedded (measured with
   ``rag index`` when a model is given) beside what the old key scheme (fingerprint = byte offsets
   + bytes) would have re-embedded, computed from the same two versions.

BM25 only by default; ``--model-dir`` adds vectors (embedded with ``rag index`` at each step; the
background indexer is off so the counts are exact). The bench raises the cache caps in its own
config (``--default-caps`` keeps the daemon's defaults). The KDF keeps its default parameters.

    .venv/bin/python -m bench.bench_scale                                    # BM25, 10k and 100k
    .venv/bin/python -m bench.bench_scale --steps 10000 \\
        --model-dir ../shared/models/all-MiniLM-L6-v2-onnx                     # MiniLM, 10k
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
EVAL = SHARED / "eval"

from bench.eval_beir import Conn, launch_daemon, load_jsonl  # noqa: E402
from memoriesd.text.fragments import split_fragments  # noqa: E402

PASSPHRASE = "bench scale passphrase"
FIRST_FOLDER_NOTES = 1000
_KEY = bytes(32)  # fragment counting only (the count does not depend on the key)


def log(msg: str) -> None:
    print(f"[bench_scale] {msg}", file=sys.stderr, flush=True)


def n_fragments(text: str) -> int:
    return len(split_fragments("r", 1, text, _KEY))


# ---------------------------------------------------------------------------------------- corpus


def load_docs(seed: int) -> list[tuple[str, str]]:
    """(title, text) of every source document, shuffled with ``seed``."""
    docs: list[tuple[str, str]] = []
    for d in load_jsonl(EVAL / "scifact" / "corpus.jsonl"):
        if d.get("text"):
            docs.append((" ".join((d.get("title") or "SciFact").split())[:120], d["text"]))
    for i, d in enumerate(load_jsonl(EVAL / "xquad-zh" / "corpus.jsonl")):
        docs.append((f"XQuAD 段落 {i}", d["text"]))
    with tarfile.open(EVAL / "tldr.tar.gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or not member.name.endswith(".md") or len(parts) < 4 or not parts[1].startswith("pages"):
                continue
            f = tar.extractfile(member)
            if f is None:
                continue
            text = f.read().decode("utf-8", "replace")
            lines = text.splitlines()
            title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("# ") else parts[-1][:-3]
            body = "\n".join(lines[1:]).strip() if lines and lines[0].startswith("# ") else text
            docs.append((f"{title} ({parts[1]}/{parts[2]})", body))
    random.Random(seed).shuffle(docs)
    return docs


class NoteWriter:
    """Writes notes of about ``note_bytes`` from the document stream; each section heading carries
    a serial number, so a document repeated in a later pass is a different passage."""

    def __init__(self, docs: list[tuple[str, str]], note_bytes: int) -> None:
        self.docs = docs
        self.note_bytes = note_bytes
        self.pos = 0
        self.serial = 0
        self.notes = 0

    def _section(self) -> str:
        title, text = self.docs[self.pos % len(self.docs)]
        self.pos += 1
        self.serial += 1
        return f"## {title} · {self.serial}\n\n{text.strip()}\n"

    def write(self, folder: Path, *, notes: int | None = None, fragments: int | None = None) -> dict[str, int]:
        """Write ``notes`` notes, or notes until they hold ``fragments`` fragments."""
        folder.mkdir(parents=True, exist_ok=True)
        made = frags = size = 0
        while (notes is not None and made < notes) or (fragments is not None and frags < fragments):
            self.notes += 1
            parts = [f"---\ntags: [bench, set{self.notes % 7}]\n---\n# Note {self.notes}\n"]
            length = 0
            while length < self.note_bytes:
                section = self._section()
                parts.append(section)
                length += len(section.encode("utf-8"))
            text = "\n".join(parts)
            sub = folder / f"d{self.notes // 500:03d}"
            sub.mkdir(exist_ok=True)
            data = text.encode("utf-8")
            (sub / f"note-{self.notes:06d}.md").write_bytes(data)
            made += 1
            size += len(data)
            frags += n_fragments(text)
        return {"notes": made, "bytes": size, "fragments": frags}


# ---------------------------------------------------------------------------------------- daemon


def write_config(home: Path, model_dir: str | None, default_caps: bool, fragments: int) -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = [
        "[daemon]\nauto_lock_minutes = 0\n",
        "[rag]\noperation_budget_seconds = 3600\non_demand_embed_limit = 0\nbackground_index = false\n",
    ]
    if model_dir:
        cfg.append(f'local_model_dir = "{Path(model_dir).resolve()}"\nlocal_threads = {os.cpu_count() or 2}\n')
    if not default_caps:
        big = max(200_000, fragments * 2)
        cfg.append(f"[rag.cache]\nmax_fragments = {big}\nmax_source_mib = 4096\nmax_vector_mib = 8192\n")
    (home / "config.toml").write_text("".join(cfg))


def start_daemon(home: Path) -> subprocess.Popen[bytes]:
    return launch_daemon(home)


def rss(pid: int) -> dict[str, float]:
    """The daemon's resident and peak resident memory (MiB) from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss_mib" if key == "VmRSS" else "peak_rss_mib"] = round(int(value.split()[0]) / 1024, 1)
    return out


def cli(home: Path, *args: str) -> tuple[float, Any]:
    """Run the real CLI (``--json``); (seconds, parsed output)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "memories_cli.main", "--home", str(home), "--json", *args],
                       capture_output=True, text=True, cwd=str(REPO), timeout=7200)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"memories {' '.join(args[:2])} failed: {r.stderr.strip()[-500:]}")
    return dt, json.loads(r.stdout) if r.stdout.strip() else None


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))], 2)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 50), "p95": pct(values, 95), "n": len(values)}


def load_queries(n: int) -> list[str]:
    en = [q["text"] for q in load_jsonl(EVAL / "scifact" / "queries.jsonl")]
    zh = [q["text"] for q in load_jsonl(EVAL / "xquad-zh" / "queries.jsonl")]
    n_zh = max(1, n // 5)
    return en[: n - n_zh] + zh[:n_zh]


# ---------------------------------------------------------------------------------------- measures


class Bench:
    def __init__(self, args: argparse.Namespace, home: Path, proc: subprocess.Popen[bytes]) -> None:
        self.args = args
        self.home = home
        self.proc = proc
        self.conn = Conn(home / "run" / "memoriesd.sock")
        self.vid = ""
        self.modes = ["bm25", "vector", "hybrid"] if args.model_dir else ["bm25"]
        self.queries = load_queries(args.queries)
        self.rss_log: list[dict[str, Any]] = []

    def mark(self, what: str) -> dict[str, float]:
        m = rss(self.proc.pid)
        self.rss_log.append({"after": what, **m})
        return m

    def status(self) -> dict[str, Any]:
        return dict(self.conn.call("rag.status", {"vault": self.vid}))

    def ingest(self, folder: Path) -> dict[str, Any]:
        size = sum(p.stat().st_size for p in folder.rglob("*.md"))
        dt, out = cli(self.home, "rag", "ingest", self.vid, str(folder), "--recursive")
        return {"seconds": round(dt, 2), "mib": round(size / 2**20, 2), "mb_per_s": round(size / 1e6 / dt, 2),
                "added": out["added"], "updated": out["updated"], "unchanged": out["unchanged"],
                "refused": len(out["refused"])}

    def index(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        embedded = 0
        while True:
            out = self.conn.call("rag.index", {"vault": self.vid})
            embedded += out["embedded"]
            if out["remaining"] == 0:
                break
        dt = time.perf_counter() - t0
        return {"seconds": round(dt, 2), "embedded": embedded, "fragments_per_s": round(embedded / dt, 1) if dt else None}

    def search(self, query: str, mode: str) -> tuple[float, dict[str, float]]:
        t0 = time.perf_counter()
        r = self.conn.call("rag.search", {"vault": self.vid, "query": query, "mode": mode, "limit": 10})
        return (time.perf_counter() - t0) * 1000, r["timings_ms"]

    def latencies(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for mode in self.modes:
            self.search(self.queries[0], mode)  # warm
            rt, server, excl, embed = [], [], [], []
            for q in self.queries:
                ms, timings = self.search(q, mode)
                rt.append(ms)
                server.append(timings["total_ms"])
                if "query_embed_ms" in timings:
                    embed.append(timings["query_embed_ms"])
                    excl.append(timings["total_ms"] - timings["query_embed_ms"])
            entry: dict[str, Any] = {"daemon_round_trip_ms": summary(rt), "daemon_total_ms": summary(server)}
            if embed:
                entry["query_embedding_ms"] = summary(embed)
                entry["daemon_total_excluding_query_embedding_ms"] = summary(excl)
            cli_ms = []
            for q in self.queries[: self.args.cli_queries]:
                dt, _ = cli(self.home, "rag", "search", self.vid, q, "--mode", mode, "--limit", "10")
                cli_ms.append(dt * 1000)
            entry["cli_ms"] = summary(cli_ms)
            out[mode] = entry
        starts = [cli(self.home, "vault", "list")[0] * 1000 for _ in range(5)]
        out["cli_process_start_ms"] = summary(starts)  # a no-op round trip: what every CLI call pays
        return out

    def first_searches(self) -> dict[str, Any]:
        """Lock, unlock, first search, for each mode (cold each time)."""
        out: dict[str, Any] = {}
        q = self.queries[1]
        for mode in self.modes:
            self.conn.call("vault.lock", {"vault": self.vid})
            t0 = time.perf_counter()
            self.conn.call("vault.unlock", {"vault": self.vid, "passphrase": PASSPHRASE})
            t1 = time.perf_counter()
            ms, timings = self.search(q, mode)
            t2 = time.perf_counter()
            second, _ = self.search(self.queries[2], mode)
            out[mode] = {"unlock_s": round(t1 - t0, 3), "first_search_s": round(ms / 1000, 3),
                         "unlock_to_first_result_s": round(t2 - t0, 3), "first_search_timings_ms":
                         {k: round(v, 1) for k, v in timings.items()}, "second_search_ms": round(second, 1)}
            self.mark(f"unlock + first {mode} search")
        return out

    def sealed_bytes(self, fragments: int) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for p in (self.home / "vaults" / self.vid).iterdir():
            if p.is_file():
                stem = p.name.split(".")[0]
                kind = "log" if stem.startswith("log-") else "vectors" if stem.startswith("vectors-") else stem
                kinds[kind] = kinds.get(kind, 0) + p.stat().st_size
        total = sum(kinds.values())
        return {"total_mib": round(total / 2**20, 2), "per_fragment": round(total / max(1, fragments), 1),
                "per_fragment_by_kind": {k: round(v / max(1, fragments), 1) for k, v in sorted(kinds.items())}}


def edit_measure(b: Bench, work: Path, docs: list[tuple[str, str]]) -> dict[str, Any]:
    """A 20-fragment note, embedded; one line near its top made longer; what is re-embedded."""
    folder = work / "edit"
    folder.mkdir()
    paras = [" ".join(t.split()) for _, t in docs if 300 <= len(" ".join(t.split())) <= 600 and t.isascii()]
    chosen: list[str] = []
    while n_fragments("# Edited note\n\n" + "\n\n".join(chosen) + "\n") < 20:
        chosen.append(paras[len(chosen)])
    while n_fragments("# Edited note\n\n" + "\n\n".join(chosen) + "\n") > 20:
        chosen[-1] = chosen[-1][: len(chosen[-1]) // 2]
    before = "# Edited note\n\n" + "\n\n".join(chosen) + "\n"
    after = before.replace(chosen[0], chosen[0].replace(" ", " (edited) ", 1), 1)
    note = folder / "edited.md"
    note.write_text(before)
    b.ingest(folder)
    if b.args.model_dir:
        b.index()
    note.write_text(after)
    out: dict[str, Any] = {"fragments": n_fragments(before), "ingest": b.ingest(folder)}
    old = {(f.start, f.end, f.text) for f in split_fragments("r", 1, before, _KEY)}
    new = split_fragments("r", 1, after, _KEY)
    out["old_scheme_would_re_embed"] = sum(1 for f in new if (f.start, f.end, f.text) not in old)
    old_texts = {f.text for f in split_fragments("r", 1, before, _KEY)}
    out["content_keys_changed"] = sum(1 for f in new if f.text not in old_texts)
    if b.args.model_dir:
        out["re_embedded_measured"] = b.index()["embedded"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="10000,100000", help="fragment counts to measure at (ascending)")
    ap.add_argument("--model-dir", default=None, help="a local model directory (vectors); BM25 only without")
    ap.add_argument("--note-kib", type=float, default=5.9, help="size of a note (a 1,000-note folder is ~10k fragments)")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--cli-queries", type=int, default=10)
    ap.add_argument("--default-caps", action="store_true", help="keep the daemon's default [rag.cache] caps")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the bench home (printed on stderr)")
    args = ap.parse_args()
    steps = sorted(int(s) for s in args.steps.split(","))
    work = Path(tempfile.mkdtemp(prefix="mbs", dir="/tmp"))
    home = work / "h"
    write_config(home, args.model_dir, args.default_caps, steps[-1])
    result: dict[str, Any] = {
        "steps": steps, "model_dir": args.model_dir, "cpus": os.cpu_count(), "default_caps": args.default_caps,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    log(f"home {home}; loading the corpora")
    docs = load_docs(args.seed)
    writer = NoteWriter(docs, int(args.note_kib * 1024))
    result["source_documents"] = len(docs)
    proc = start_daemon(home)
    try:
        b = Bench(args, home, proc)
        b.vid = b.conn.call("vault.create", {"name": "scale", "passphrase": PASSPHRASE})["vault_id"]
        b.mark("start")
        first_folder = work / "notes-1000"
        result["steps_measured"] = []
        for i, target in enumerate(steps):
            step: dict[str, Any] = {"target_fragments": target}
            if i == 0:
                made = writer.write(first_folder, notes=FIRST_FOLDER_NOTES)
                folder = first_folder
                if made["fragments"] < target:
                    extra = writer.write(work / "notes-0b", fragments=target - made["fragments"])
                    made = {k: made[k] + extra[k] for k in made}
            else:
                have = result["steps_measured"][-1]["fragments"]
                folder = work / f"notes-{i}"
                made = writer.write(folder, fragments=target - have)
            step["written"] = made
            log(f"step {target}: ingesting {made['notes']} notes ({made['bytes'] / 2**20:.1f} MiB)")
            step["ingest"] = b.ingest(folder)
            if i == 0 and (work / "notes-0b").exists():
                step["ingest_rest"] = b.ingest(work / "notes-0b")
            step["rss_after_ingest"] = b.mark(f"ingest to {target}")
            t0 = time.perf_counter()
            ms, timings = b.search(b.queries[0], "bm25")
            step["first_bm25_search_after_ingest_s"] = round(time.perf_counter() - t0, 3)
            step["rss_after_index"] = b.mark(f"first search at {target}")
            st = b.status()
            step["fragments"] = st["fragments"]
            if args.model_dir:
                log(f"step {target}: embedding (rag index)")
                step["embed"] = b.index()
                step["rss_after_embed"] = b.mark(f"embedding at {target}")
            log(f"step {target}: search latencies")
            step["latency"] = b.latencies()
            step["rss_after_searches"] = b.mark(f"searches at {target}")
            log(f"step {target}: unlock -> first search")
            step["unlock_to_first_search"] = b.first_searches()
            step["sealed_on_disk"] = b.sealed_bytes(step["fragments"])
            result["steps_measured"].append(step)
        log("re-ingest of the unchanged 1,000-note folder")
        b.search(b.queries[0], "bm25")
        first = result["steps_measured"][0]["ingest"]
        again = b.ingest(first_folder)
        result["reingest_unchanged_1000_notes"] = {
            "seconds": again["seconds"], "unchanged": again["unchanged"], "added": again["added"],
            "updated": again["updated"], "first_ingest_seconds": first["seconds"],
            "ratio_to_first_ingest": round(again["seconds"] / first["seconds"], 3),
            "cli_process_start_ms": result["steps_measured"][-1]["latency"]["cli_process_start_ms"]["p50"],
            "vault_fragments": result["steps_measured"][-1]["fragments"],
        }
        result["rss_after_reingest"] = b.mark("re-ingest unchanged")
        log("one-line edit of a 20-fragment note")
        result["edit_one_line"] = edit_measure(b, work, docs)
        result["rss"] = b.rss_log
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
