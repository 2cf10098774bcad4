"""The lexical part of ``bench_first_search.py``: unlock -> first BM25 result with the sealed lexical
snapshot and without it (cold rebuild), catch-up, CLI path and warm search speed, for one vault size.

Imported by ``bench_first_search.py`` (see its docstring for what is measured); not run on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import PASSPHRASE, Conn, start_daemon  # noqa: E402
from memoriesd.text.fragments import split_fragments  # noqa: E402

FIRST_QUERY = "protein folding in the endoplasmic reticulum"
CATCH_UP_NOTES = 100
CLI_QUERIES = 30
SNAPSHOT = "lexical-index.bin"
_RESTORED = re.compile(r"lexical index restored from its sealed snapshot \((\d+) fragments, (\d+) records caught up")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * q))], 3)


def write_notes(folder: Path, docs: list[dict[str, Any]], fragments: int, *, start: int = 0) -> tuple[int, int, int]:
    """Markdown files of SciFact abstracts, distinct titles, until ``fragments`` fragments.
    Returns (files, bytes, fragments)."""
    folder.mkdir(parents=True, exist_ok=True)
    n_files = n_bytes = n_frags = 0
    i = start
    while n_frags < fragments:
        d = docs[i % len(docs)]
        title = " ".join((d.get("title") or "").split()) or "untitled"
        text = f"# {title} (copy {i // len(docs)})\n\n{d['text'] or '-'}\n"
        n_frags += max(1, len(split_fragments("x", 1, text, bytes(32))))
        data = text.encode("utf-8")
        (folder / f"d{i:06d}.md").write_bytes(data)
        n_files += 1
        n_bytes += len(data)
        i += 1
    return n_files, n_bytes, n_frags


class Session:
    """One daemon on a throw-away home with one vault."""

    def __init__(self, work: Path, size: int) -> None:
        self.home = work / "h"
        self.proc = start_daemon(self.home, None, size)
        self.conn = Conn(self.home / "run" / "memoriesd.sock")
        self.vid = self.conn.call("vault.create", {"name": "bench", "passphrase": PASSPHRASE})["vault_id"]
        self.snapshot = self.home / "vaults" / self.vid / SNAPSHOT

    def log_text(self) -> str:
        p = self.home / "logs" / "memoriesd.log"
        return p.read_text("utf-8", "replace") if p.exists() else ""

    def restores(self) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in _RESTORED.findall(self.log_text())]

    def search(self, query: str = FIRST_QUERY) -> dict[str, Any]:
        return self.conn.call("rag.search", {"vault": self.vid, "query": query, "mode": "bm25", "limit": 10})

    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    def lock(self) -> float:
        return self.timed(lambda: self.conn.call("vault.lock", {"vault": self.vid}))[0]

    def unlock_and_search(self) -> dict[str, Any]:
        unlock_s, _ = self.timed(lambda: self.conn.call("vault.unlock", {"vault": self.vid, "passphrase": PASSPHRASE}))
        search_s, r = self.timed(self.search)
        return {
            "unlock_seconds": round(unlock_s, 3),
            "first_search_seconds": round(search_s, 3),
            "first_search_index_ms": r["timings_ms"].get("index_ms"),
            "unlock_to_first_result_seconds": round(unlock_s + search_s, 3),
            "results": len(r["results"]),
        }

    def wait_for_snapshot(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.snapshot.exists() and "lexical snapshot written" in self.log_text():
                return
            time.sleep(0.2)
        raise SystemExit("the lexical snapshot was not written")

    def cli(self, *args: str, stdin: str = "") -> float:
        env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "memories_cli.main", "--home", str(self.home), *args],
            input=stdin, capture_output=True, check=True, cwd=str(REPO), env=env, text=True,
        )
        return time.perf_counter() - t0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def _median_case(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("unlock_seconds", "first_search_seconds", "unlock_to_first_result_seconds")
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    out["runs"] = runs
    return out


def _speed(s: Session, queries: list[str]) -> dict[str, Any]:
    s.search("warm up")
    daemon: list[float] = []
    rtt: list[float] = []
    for q in queries:
        t0 = time.perf_counter()
        r = s.search(q)
        rtt.append((time.perf_counter() - t0) * 1000)
        daemon.append(r["timings_ms"]["total_ms"])
    return {
        "queries": len(queries),
        "daemon_total_ms_p50": pct(daemon, 0.5),
        "daemon_total_ms_p95": pct(daemon, 0.95),
        "socket_ms_p50": pct(rtt, 0.5),
        "socket_ms_p95": pct(rtt, 0.95),
    }


def lexical_bench(size: int, docs: list[dict[str, Any]], queries: list[str], *, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mbl", dir="/tmp"))
    out: dict[str, Any] = {"requested_fragments": size}
    s = Session(work, size)
    try:
        folder = work / "notes"
        files, nbytes, _ = write_notes(folder, docs, size)
        log(f"lexical {size}: ingesting {files} files ({nbytes / 1e6:.1f} MB)")
        ingest_s, rep = s.timed(lambda: s.conn.call("rag.ingest", {"vault": s.vid, "paths": [str(folder)], "recursive": True}))
        out.update({"files": files, "mb": round(nbytes / 1e6, 2), "ingest_seconds": round(ingest_s, 2), "ingested": rep["added"]})
        build_s, _ = s.timed(s.search)
        out["fragments"] = s.conn.call("rag.status", {"vault": s.vid})["fragments"]
        out["build_first_search_seconds"] = round(build_s, 3)
        s.wait_for_snapshot()
        out["snapshot_mib"] = round(s.snapshot.stat().st_size / 2**20, 2)
        m = re.findall(r"lexical snapshot written \(settled\): \d+ fragments, [\d.]+ MiB sealed in ([\d.]+) s", s.log_text())
        out["snapshot_write_seconds"] = float(m[-1]) if m else None

        snap_runs: list[dict[str, Any]] = []
        cold_runs: list[dict[str, Any]] = []
        for r in range(repeats):
            log(f"lexical {size}: cycle {r + 1}/{repeats}")
            lock_s = s.lock()  # nothing due: the snapshot on disk is current
            before = len(s.restores())
            run = s.unlock_and_search()
            run["lock_seconds_before"] = round(lock_s, 3)
            assert len(s.restores()) == before + 1, "the snapshot was not used"
            snap_runs.append(run)
            s.lock()
            s.snapshot.unlink()
            run = s.unlock_and_search()
            assert len(s.restores()) == before + 1, "a snapshot was used in the cold case"
            # This lock writes the snapshot again (none on disk, the index has rows): what lock costs at worst.
            run["lock_seconds_after_with_write"] = round(s.lock(), 3)
            s.conn.call("vault.unlock", {"vault": s.vid, "passphrase": PASSPHRASE})
            cold_runs.append(run)
        out["snapshot"] = _median_case(snap_runs)
        out["cold"] = _median_case(cold_runs)
        out["cold_over_snapshot"] = round(
            out["cold"]["unlock_to_first_result_seconds"] / out["snapshot"]["unlock_to_first_result_seconds"], 1)

        log(f"lexical {size}: catch-up after {CATCH_UP_NOTES} new notes")
        extra = work / "extra"
        extra.mkdir()
        for n in range(CATCH_UP_NOTES):
            d = docs[(n * 7) % len(docs)]
            (extra / f"x{n:04d}.md").write_text(f"# Later note {n}\n\n{d['text'] or '-'}\n", encoding="utf-8")
        s.conn.call("rag.ingest", {"vault": s.vid, "paths": [str(extra)], "recursive": True})
        s.lock()
        run = s.unlock_and_search()
        got = s.restores()[-1]
        run["caught_up_records"] = got[1]
        out["catch_up"] = run

        log(f"lexical {size}: CLI path")
        s.lock()
        unlock_cli = s.cli("vault", "unlock", s.vid, "--passphrase-stdin", stdin=PASSPHRASE + "\n")
        search_cli = s.cli("rag", "search", s.vid, FIRST_QUERY, "--mode", "bm25")
        cli: dict[str, Any] = {"snapshot": {"unlock_seconds": round(unlock_cli, 3), "first_search_seconds": round(search_cli, 3),
                                            "unlock_to_first_result_seconds": round(unlock_cli + search_cli, 3)}}
        s.lock()
        s.snapshot.unlink()
        unlock_cli = s.cli("vault", "unlock", s.vid, "--passphrase-stdin", stdin=PASSPHRASE + "\n")
        search_cli = s.cli("rag", "search", s.vid, FIRST_QUERY, "--mode", "bm25")
        cli["cold"] = {"unlock_seconds": round(unlock_cli, 3), "first_search_seconds": round(search_cli, 3),
                       "unlock_to_first_result_seconds": round(unlock_cli + search_cli, 3)}
        base = [s.timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))[0] for _ in range(5)]
        cli["python_c_pass_seconds"] = round(statistics.median(base), 3)
        # The CLI's own start (imports, Typer) without a request: what "process start" costs a search.
        cli["cli_help_seconds"] = round(statistics.median(s.cli("--help") for _ in range(5)), 3)
        out["cli"] = cli

        log(f"lexical {size}: warm BM25 search speed")
        short = [" ".join(q.split()[:3]) for q in queries]
        out["search_speed"] = {"claims": _speed(s, queries), "first_three_words": _speed(s, short)}
        cli_ms = [s.cli("rag", "search", s.vid, q, "--mode", "bm25") * 1000 for q in queries[:CLI_QUERIES]]
        start_ms = cli["cli_help_seconds"] * 1000
        claims = out["search_speed"]["claims"]
        claims["cli_ms_p50"] = pct(cli_ms, 0.5)
        claims["cli_over_daemon_plus_cli_start"] = round(pct(cli_ms, 0.5) / (claims["daemon_total_ms_p50"] + start_ms), 2)
    finally:
        s.close()
        shutil.rmtree(work, ignore_errors=True)
    return out
