#!/usr/bin/env python3
"""Watched folders: how long until an edit is searchable, and what a catch-up at unlock costs.

Prints one JSON object on stdout (progress on stderr). Through a real daemon on a throw-away home,
the user's path (`memories rag watch`, `memories rag ingest`, the daemon's own syncs):

1. extracts ``--files`` English tldr pages (``../shared/eval/tldr.tar.gz``) into a folder;
2. `rag watch VAULT DIR --recursive --prune` and times the first sync (every file new);
3. the catch-up of the unchanged folder at unlock (lock, unlock, until the sync is done), next to
   `rag ingest DIR --recursive` of the same unchanged folder by the CLI (the alternative: a ratio);
4. ``--edits`` edits of distinct files, one at a time: seconds from the write until `rag search`
   finds the new word (includes ``[rag] watch_debounce_seconds``);
5. a save storm (20 writes of one file in a row): how many syncs it took (1 is the goal).

    .venv/bin/python scripts/bench_watch.py [--files 1000] [--edits 10] [--debounce 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from memoriesd.server import protocol  # noqa: E402

TLDR = REPO.parent / "shared" / "eval" / "tldr.tar.gz"
PASSPHRASE = "bench passphrase"


def log(msg: str) -> None:
    print(f"[bench_watch] {msg}", file=sys.stderr, flush=True)


def call(home: Path, method: str, params: dict[str, Any]) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(home / "run" / "memoriesd.sock"))
        s.sendall(protocol.encode({"id": 1, "method": method, "params": params}))
        while True:
            msg = protocol.recv_frame(s)
            if "progress" in msg:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']['code']}: {msg['error']['message']}")
            return msg["result"]


def cli(home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "memories_cli.main", "--home", str(home), *args], input=stdin, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"memories {' '.join(args)} failed: {r.stderr}")
    return r


def extract(folder: Path, n: int) -> int:
    done = 0
    with tarfile.open(TLDR) as tar:
        for m in tar:
            parts = Path(m.name).parts
            if m.isfile() and "pages" in parts and m.name.endswith(".md"):
                f = tar.extractfile(m)
                assert f is not None
                dest = folder / parts[-2] / parts[-1]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(f.read())
                done += 1
                if done >= n:
                    break
    return done


def watch_row(home: Path, vid: str) -> dict[str, Any]:
    return call(home, "rag.status", {"vault": vid})["watch"][0]  # type: ignore[no-any-return]


def until_synced(home: Path, vid: str, syncs: int, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        w = watch_row(home, vid)
        if w["syncs"] >= syncs and w["state"] == "watching" and not w["pending"]:
            return time.perf_counter() - t0
        time.sleep(0.02)
    raise SystemExit(f"no sync {syncs} within {timeout} s: {watch_row(home, vid)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--edits", type=int, default=10)
    ap.add_argument("--debounce", type=float, default=1.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bw", dir="/tmp"))
    home, folder = root / "h", root / "notes"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(f"[daemon]\nauto_lock_minutes = 0\n\n[rag]\nwatch_debounce_seconds = {args.debounce}\n")
    daemon = subprocess.Popen([sys.executable, "-m", "memoriesd.server.daemon", "--home", str(home)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    out: dict[str, Any] = {"debounce_seconds": args.debounce}
    try:
        deadline = time.monotonic() + 60
        while not (home / "run" / "memoriesd.sock").exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the daemon did not start")
            time.sleep(0.05)
        n = extract(folder, args.files)
        out["files"] = n = len(list(folder.rglob("*.md")))
        out["megabytes"] = round(sum(p.stat().st_size for p in folder.rglob("*.md")) / 1e6, 3)
        vid = cli(home, "vault", "create", "bench", "--passphrase-stdin", stdin=PASSPHRASE + "\n").stdout.split()[-1]
        log(f"{n} files; watching")
        t0 = time.perf_counter()
        cli(home, "rag", "watch", vid, str(folder), "--recursive", "--prune")
        until_synced(home, vid, 1)
        out["first_sync_seconds"] = round(time.perf_counter() - t0, 3)
        first = watch_row(home, vid)
        out["cards"], out["refused"] = first["added"], first["refused"]
        call(home, "vault.lock", {"vault": vid})
        call(home, "vault.unlock", {"vault": vid, "passphrase": PASSPHRASE})
        out["catch_up_unchanged_seconds"] = round(until_synced(home, vid, 1), 3)
        t0 = time.perf_counter()
        cli(home, "rag", "ingest", vid, str(folder), "--recursive")
        out["cli_ingest_unchanged_seconds"] = round(time.perf_counter() - t0, 3)
        out["catch_up_vs_cli_ingest"] = round(out["catch_up_unchanged_seconds"] / out["cli_ingest_unchanged_seconds"], 3)
        latencies = []
        files = sorted(folder.rglob("*.md"))[: args.edits]
        for i, f in enumerate(files):
            word = f"zqxedit{i}word"
            with f.open("a") as h:
                h.write(f"\n{word}\n")
            t0 = time.perf_counter()
            while not call(home, "rag.search", {"vault": vid, "query": word, "mode": "bm25"})["results"]:
                time.sleep(0.02)
            latencies.append(time.perf_counter() - t0)
        out["edit_to_searchable_seconds"] = {"p50": round(statistics.median(latencies), 3), "max": round(max(latencies), 3), "n": len(latencies)}
        until_synced(home, vid, 0)
        before = watch_row(home, vid)["syncs"]
        target = files[0]
        for i in range(20):
            target.write_text(f"# storm\n\nsave {i}\n")
        until_synced(home, vid, before + 1)
        time.sleep(args.debounce * 3)
        out["save_storm_20_writes_syncs"] = watch_row(home, vid)["syncs"] - before
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    main()
