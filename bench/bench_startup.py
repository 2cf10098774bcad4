"""Start-up of the `memories` CLI against ``python -c pass``, in the same run (issue 29, item 8).

Times fresh processes, as a person or a script runs them:

- ``python -c pass`` (the floor: the interpreter and ``site``, with this virtual environment);
- ``python -c "import typer"`` (what the CLI's framework costs before any command of ours);
- ``memories --help``;
- ``memories rag search VAULT QUERY --mode bm25`` against a real daemon with a small vault
  (``--docs`` SciFact abstracts as Markdown files through `rag ingest`; no model, bm25 only);
- ``memories --version``.

Every repetition runs each command once, in turn (interleaved, so a busy machine slows all alike);
the JSON gives the median wall time and the median CPU time (user + system of the child, from
``getrusage``, steadier than wall time on a shared machine) of each, and each one's ratio to
``python -c pass``. ``--compare DIR`` adds the same CLI commands from another checkout (for
example ``/work/main``, to see before and after in one run); the CLI runs as ``python -m
memories_cli.main`` from the checkout's directory for both trees then.

    .venv/bin/python -m bench.bench_startup [--reps 30] [--docs 300] [--compare ../main]

Takes about a minute (30 repetitions); needs ``../shared/eval/scifact``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.eval_beir import PASSPHRASE, load_jsonl, start_daemon
from memories_cli.client import Client
from memoriesd.home import resolve_home

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "eval" / "scifact" / "corpus.jsonl"
QUERY = "vitamin D deficiency and bone density"


@dataclass
class Timed:
    """One command's samples: wall and CPU seconds per run."""

    name: str
    argv: list[str]
    cwd: Path
    wall: list[float]
    cpu: list[float]

    def run(self, env: dict[str, str]) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run(self.argv, cwd=self.cwd, env=env, capture_output=True, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(
                f"{self.name} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-500:]}"
            )
        self.wall.append(wall)
        self.cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fill_vault(home: Path, docs: int) -> str:
    """One unlocked vault of ``docs`` SciFact abstracts (bm25 only) on the daemon of ``home``; its id."""
    conn = Client(resolve_home(str(home)), autostart=False)  # routes each vault's requests to its process
    vid = str(conn.call("vault.create", {"name": "bench", "passphrase": PASSPHRASE})["vault_id"])
    folder = home.parent / "notes"
    folder.mkdir()
    for i, doc in enumerate(load_jsonl(SCIFACT)[:docs]):
        title = " ".join((doc.get("title") or "").split()) or "untitled"
        (folder / f"d{i:05d}.md").write_text(f"# {title}\n\n{doc['text'] or '-'}\n", encoding="utf-8")
    report = conn.call("rag.ingest", {"vault": vid, "paths": [str(folder.resolve())], "recursive": True})
    log(f"{len(report['records'])} notes ingested")
    return vid


def cli_commands(label: str, cli: list[str], cwd: Path, home: Path, vid: str) -> list[Timed]:
    base = [*cli, "--home", str(home)]
    return [
        Timed(f"{label}help", [*base, "--help"], cwd, [], []),
        Timed(f"{label}rag_search_bm25", [*base, "rag", "search", vid, QUERY, "--mode", "bm25"], cwd, [], []),
        Timed(f"{label}version", [*base, "--version"], cwd, [], []),
    ]


def summary(timed: list[Timed]) -> dict[str, Any]:
    floor = timed[0]
    floor_wall, floor_cpu = statistics.median(floor.wall), statistics.median(floor.cpu)
    out: dict[str, Any] = {}
    for t in timed:
        wall, cpu = statistics.median(t.wall), statistics.median(t.cpu)
        out[t.name] = {
            "wall_ms_p50": round(wall * 1000, 1),
            "cpu_ms_p50": round(cpu * 1000, 1),
            "wall_ratio": round(wall / floor_wall, 2),
            "cpu_ratio": round(cpu / floor_cpu, 2) if floor_cpu > 0 else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--docs", type=int, default=300, help="SciFact abstracts in the vault")
    ap.add_argument("--compare", type=Path, default=None, help="another checkout whose CLI runs alongside")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bstart", dir="/tmp"))
    home = work / "h"
    proc = None
    try:
        proc = start_daemon(home, None, args.docs)
        vid = fill_vault(home, args.docs)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MEMORIES_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")  # bytecode as an install has it, no tree written
        env["COLUMNS"] = "100"
        py = sys.executable
        script = Path(py).with_name("memories")
        timed = [
            Timed("python_c_pass", [py, "-c", "pass"], REPO, [], []),
            Timed("python_import_typer", [py, "-c", "import typer"], REPO, [], []),
        ]
        if args.compare:
            timed += cli_commands("", [py, "-m", "memories_cli.main"], REPO, home, vid)
            timed += cli_commands(
                "compare_", [py, "-m", "memories_cli.main"], args.compare.resolve(), home, vid
            )
        else:
            cli = [str(script)] if script.exists() else [py, "-m", "memories_cli.main"]
            timed += cli_commands("", cli, REPO, home, vid)
        for t in timed:  # write the bytecode, warm the page cache and the daemon's query path, unmeasured
            t.run(env)
            t.wall.clear()
            t.cpu.clear()
        for rep in range(args.reps):
            for t in timed:
                t.run(env)
            if (rep + 1) % 10 == 0:
                log(f"{rep + 1}/{args.reps} repetitions")
        result = {
            "bench": "startup",
            "reps": args.reps,
            "vault_notes": args.docs,
            "cli": "python -m memories_cli.main" if args.compare else "console script",
            "compare": str(args.compare) if args.compare else None,
            "target": "memories --help and rag search <= 6x python -c pass (wall)",
            "commands": summary(timed),
        }
        print(json.dumps(result, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
