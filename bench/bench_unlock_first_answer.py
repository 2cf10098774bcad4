#!/usr/bin/env python3
"""Unlock to first answer of a big vault, through the CLI, against another commit in the same run.

Prints one JSON object on stdout (progress on stderr).

1. The Markdown folder (``bench/unlock_corpus.py``: tldr pages, SciFact and XQuAD-zh as notes,
   repeated with a copy mark) is written once under ``--data`` and reused: ``a/`` up to the first
   size (default 100,000 fragments), ``b/`` up to the second (130,000).
2. Two source trees, this one (``current``) and ``--baseline-tree`` (a ``git worktree`` of the commit
   to compare with; made from ``--baseline-ref`` when missing), each with its own daemon on its own
   home. Both homes have the defaults (production Argon2id, caps, background indexing) except
   ``auto_lock_minutes = 0``, and no embedding model installed: the CPU goes to the lexical path.
   The vault is created once in a template home, copied to each tree's home.
3. For each size: ``memories rag ingest bench <folder> -r`` by each tree's CLI (timed); then each
   daemon is left until its processes are idle (no CPU for 2 s: what it does after an ingest, timed
   as ``settle_seconds``); then ``--cycles`` rounds of ``memories vault lock``, ``memories vault
   unlock`` (timed) and the first ``memories rag search bench QUERY --mode bm25`` (timed), one process
   each, the trees interleaved (which goes first alternates). Round 1 is the first unlock after
   the ingest; the others are later unlocks.
4. ``kdf_seconds``: the production Argon2id derivation alone (in this process, median of 3): the
   fixed share of every unlock that the user chose.

    .venv/bin/python -m bench.bench_unlock_first_answer [--data /work/h-unlock-data]
        [--sizes 100000,130000] [--cycles 4] [--baseline-tree DIR] [--baseline-ref COMMIT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.eval_beir import Conn  # noqa: E402
from bench.unlock_corpus import write_corpus  # noqa: E402

PASSPHRASE = "unlock bench: violet harbour ninety lanterns"
QUERY = "compress a directory into an archive"
_RESTORED = re.compile(
    r"lexical index restored from its sealed snapshot \((\d+) fragments, (\d+) records caught up, \d+ removed\) in ([\d.]+) s"
)
_WRITTEN = re.compile(
    r"lexical snapshot written \((\w+)\): (\d+) fragments, ([\d.]+) MiB sealed in ([\d.]+) s"
)


def log(msg: str) -> None:
    print(f"[bench_unlock_first_answer] {msg}", file=sys.stderr, flush=True)


def _cpu_of(home: Path) -> float:
    """CPU seconds (user + system) of every process whose command line names ``home``."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    needle = str(home).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _pid_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of one process; -1 when it is gone."""
    if pid is None:
        return -1.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Tree:
    """One source tree's daemon on its own home."""

    def __init__(self, name: str, tree: Path, home: Path) -> None:
        self.name, self.tree, self.home = name, tree, home
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env_cwd = os.getcwd()
        os.chdir(self.tree)  # launch_daemon runs from REPO: run the tree's own memoriesd instead
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memoriesd.main", "--home", str(self.home)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=str(self.tree),
            )
        finally:
            os.chdir(env_cwd)
        sock = self.home / "run" / "memoriesd.sock"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sock.exists():
                try:
                    Conn(sock).call("daemon.status", {})
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise SystemExit(f"{self.name}: the daemon did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(120)
            self.proc = None

    def cli(self, *args: str, stdin: str = "") -> tuple[float, str]:
        env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "memories_cli.main", "--home", str(self.home), *args],
            input=stdin,
            capture_output=True,
            cwd=str(self.tree),
            env=env,
            text=True,
        )
        dt = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(
                f"{self.name}: memories {' '.join(args[:2])} failed: {out.stderr.strip()[-400:]}"
            )
        return dt, out.stdout

    def log_text(self) -> str:
        p = self.home / "logs" / "memoriesd.log"
        return p.read_text("utf-8", "replace") if p.exists() else ""

    def wait_idle(self, quiet: float = 2.0, timeout: float = 600.0) -> float:
        """Seconds until the daemon's processes used no CPU (< 2 %) for ``quiet`` seconds."""
        t0 = time.monotonic()
        last = _cpu_of(self.home)
        calm_since = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.25)
            now = _cpu_of(self.home)
            if now - last > 0.005:
                calm_since = time.monotonic()
            last = now
            if time.monotonic() - calm_since >= quiet:
                return round(calm_since - t0, 2)
        return round(timeout, 1)

    def status(self) -> dict[str, Any]:
        return Conn(self.home / "run" / "memoriesd.sock").call("daemon.status", {})  # type: ignore[no-any-return]

    def cycle(self) -> dict[str, Any]:
        self.cli("vault", "lock", "bench")
        self.wait_idle(quiet=1.0, timeout=60)  # the next spare has started and loaded
        spare = self.status().get("spare_process")
        cpu0 = _pid_cpu(spare)
        before = len(_RESTORED.findall(self.log_text()))
        unlock_s, _ = self.cli("vault", "unlock", "bench", "--passphrase-stdin", stdin=PASSPHRASE + "\n")
        search_s, out = self.cli("--json", "rag", "search", "bench", QUERY, "--mode", "bm25")
        cpu1 = _pid_cpu(spare)
        served = [p["pid"] for p in self.status().get("vault_processes", [])]
        results = len(json.loads(out).get("results", []))
        restored = _RESTORED.findall(self.log_text())[before:]
        return {
            "unlock_seconds": round(unlock_s, 3),
            "first_search_seconds": round(search_s, 3),
            "unlock_to_first_result_seconds": round(unlock_s + search_s, 3),
            # CPU of the process that took the vault (the spare), from before the unlock to the
            # first result: what the machine's load does not change.
            "vault_process_cpu_seconds": round(cpu1 - cpu0, 3) if spare in served and cpu0 >= 0 else None,
            "results": results,
            "restored_from_snapshot": bool(restored),
            "restore_log_seconds": float(restored[-1][2]) if restored else None,
        }


def _kdf_seconds() -> float:
    from memoriesd.config.schema import VaultConfig
    from memoriesd.vault import crypto

    cfg = VaultConfig()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        crypto.derive_kek(
            PASSPHRASE.encode(),
            bytes(16),
            memory_kib=cfg.kdf_memory_kib,
            iterations=cfg.kdf_iterations,
            lanes=cfg.kdf_lanes,
        )
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    later = runs[1:]
    out: dict[str, Any] = {"first_after_ingest": runs[0]}
    if later:
        keys = (
            "unlock_seconds",
            "first_search_seconds",
            "unlock_to_first_result_seconds",
            "vault_process_cpu_seconds",
        )
        out["later_median"] = {
            k: round(statistics.median(v), 3)
            for k in keys
            if (v := [r[k] for r in later if r.get(k) is not None])
        }
    out["later"] = later
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=REPO.parent / "h-unlock-data")
    ap.add_argument("--sizes", default="100000,130000")
    ap.add_argument(
        "--cycles",
        type=int,
        default=4,
        help="lock/unlock/search rounds per size and tree (1st: after ingest)",
    )
    ap.add_argument("--baseline-tree", type=Path, default=None)
    ap.add_argument(
        "--baseline-ref", default="main", help="commit for the baseline worktree when it is missing"
    )
    ap.add_argument("--only", choices=["current", "baseline"], default=None, help="run one tree only")
    args = ap.parse_args()
    data: Path = args.data
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    manifest = write_corpus(data / "notes", sizes)
    base_tree: Path = args.baseline_tree or data / "baseline"
    if not base_tree.exists() and args.only != "current":
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base_tree), args.baseline_ref],
            check=True,
        )
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "corpus": manifest,
        "model": "none installed (background embedding off): the lexical path only",
        "trees": {
            "current": subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            + (
                "+dirty"
                if subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD"]).returncode
                else ""
            )
        },
    }
    if args.only != "current":
        result["trees"]["baseline"] = subprocess.run(
            ["git", "-C", str(base_tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    result["kdf_seconds"] = _kdf_seconds()

    runs_dir = data / "run"
    shutil.rmtree(runs_dir, ignore_errors=True)
    template = runs_dir / "template"
    template.mkdir(parents=True, mode=0o700)
    (template / "config.toml").write_text("[daemon]\nauto_lock_minutes = 0\n")
    maker = Tree("template", REPO, template)
    maker.start()
    try:
        maker.cli("vault", "create", "bench", "--passphrase-stdin", stdin=PASSPHRASE + "\n")
    finally:
        maker.stop()
    names = [n for n in ("current", "baseline") if args.only in (None, n)]
    trees: list[Tree] = []
    for name in names:
        home = runs_dir / name
        shutil.copytree(template, home, ignore=shutil.ignore_patterns("run", "logs", "*.sock", "*.lock"))
        trees.append(Tree(name, REPO if name == "current" else base_tree.resolve(), home))
    try:
        for t in trees:
            t.start()
            t.cli("vault", "unlock", "bench", "--passphrase-stdin", stdin=PASSPHRASE + "\n")
        result["sizes"] = {}
        for k, size in enumerate(sizes):
            folder = data / "notes" / chr(ord("a") + k)
            per: dict[str, Any] = {}
            for t in trees:
                log(f"{size}: {t.name} ingests {folder.name}/ (load {os.getloadavg()[0]:.2f})")
                ingest_s, out = t.cli("--json", "rag", "ingest", "bench", str(folder), "-r")
                settle = t.wait_idle()
                status = json.loads(t.cli("--json", "rag", "status", "bench")[1])
                written = _WRITTEN.findall(t.log_text())
                per[t.name] = {
                    "ingest_seconds": round(ingest_s, 2),
                    "added": json.loads(out).get("added"),
                    "fragments": status.get("fragments"),
                    "settle_seconds": settle,
                    "snapshots_written": [
                        {"why": w[0], "fragments": int(w[1]), "mib": float(w[2]), "seconds": float(w[3])}
                        for w in written
                    ],
                    "runs": [],
                }
            for r in range(args.cycles):
                order = trees if r % 2 == 0 else trees[::-1]
                for t in order:
                    run = t.cycle()
                    run["loadavg_1min"] = round(os.getloadavg()[0], 2)
                    per[t.name]["runs"].append(run)
                    log(
                        f"{size} {t.name} round {r + 1}: unlock {run['unlock_seconds']} s + search {run['first_search_seconds']} s"
                    )
                    t.wait_idle(quiet=1.0, timeout=120)
            for name in [n for n in per if n in ("current", "baseline")]:
                per[name].update(_summary(per[name].pop("runs")))
            if "current" in per and "baseline" in per:
                c, b = per["current"], per["baseline"]
                key = "unlock_to_first_result_seconds"
                per["baseline_over_current"] = {
                    "first_after_ingest": round(
                        b["first_after_ingest"][key] / c["first_after_ingest"][key], 2
                    ),
                    "later": round(b["later_median"][key] / c["later_median"][key], 2)
                    if "later_median" in c
                    else None,
                }
            result["sizes"][str(size)] = per
    finally:
        for t in trees:
            t.stop()
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
