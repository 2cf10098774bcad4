#!/usr/bin/env python3
"""What the daemon's process shape costs: unlock -> first BM25 result, and the memory of all its processes.

Two code trees in one run, each CLI run with its tree as cwd and PYTHONPATH (so its daemon and the
daemon's children run that code: ``trees.*.daemon_code_root``): A, a temporary git worktree of ``--base``
(the one-process daemon); B, this checkout (``--tree-b DIR``, ``--b-rev REV``). ``--set-a``/``--set-b
SECTION.KEY=VALUE`` add to one tree's config.toml (``--set-b daemon.vault_process=true``). One JSON
object on stdout, progress on stderr.

1. ``unlock``: a vault at the DEFAULT key derivation holding ``--notes`` small Markdown notes (``rag
   ingest DIR -r``), built by A and copied for each tree; both daemons up, the vault locked;
   ``--repeats`` rounds, A then B, of ``memories vault unlock V --passphrase-stdin`` + ``memories rag
   search V QUERY --mode bm25`` (timed from outside), then ``vault lock`` and a wait until the daemon's
   processes are idle. Per tree min/median/max; ``b_minus_a``: median of the paired B - A (target
   for unlock + search: <= 0.25 s).
2. ``memory``: ``[rag] local_model_dir = --model-dir``; two vaults of ``--fragments`` fragments embedded
   once by A (``--cache DIR`` keeps them), copied for each tree; unlock both, a hybrid search in each,
   every vector loaded, then PSS (/proc/PID/smaps_rollup) summed over the daemon and all descendants,
   per process with its role (``daemon status --json``, else guessed from the command line); again
   after ``vault lock --all``. Targets: <= 1.0 GiB with a Q4 model, <= 1.4 GiB with the fp32 export.

    .venv/bin/python -m bench.bench_process_shape [--notes 2000 --repeats 5] [--fragments 10000]
        [--model-dir DIR] [--cache DIR] [--set-b daemon.vault_process=true] [--skip-unlock|--skip-memory]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PASSPHRASE = "bench process shape passphrase\n"
VAULTS = ("mem1", "mem2")
Settings = dict[str, dict[str, Any]]


def log(msg: str) -> None:
    print(f"[bench_process_shape] {msg}", file=sys.stderr, flush=True)


def parse_sets(items: list[str]) -> Settings:
    """``SECTION.KEY=VALUE`` (VALUE in TOML, else a bare string) -> {section: {key: value}}."""
    out: Settings = {}
    for item in items:
        key, eq, value = item.partition("=")
        section, dot, name = key.strip().rpartition(".")
        if not eq or not dot:
            raise SystemExit(f"expected SECTION.KEY=VALUE, got {item!r}")
        try:
            out.setdefault(section, {})[name] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out.setdefault(section, {})[name] = value.strip()
    return out


def write_config(home: Path, *layers: Settings) -> None:
    merged: Settings = {}
    for layer in layers:
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
    text = "".join(f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
                   for section, values in merged.items())  # JSON strings, booleans and numbers are TOML
    (home / "config.toml").write_text(text, encoding="utf-8")


def daemon_pid(home: Path) -> int | None:
    pid_file = home / "run" / "memoriesd.pid"
    return int(pid_file.read_text().split()[0]) if pid_file.exists() else None


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


@dataclass
class Tree:
    name: str
    path: Path
    commit: str
    settings: Settings
    homes: list[Path] = field(default_factory=list)  # homes whose daemon this tree may have started
    code_root: str | None = None  # where its daemon imports memoriesd from (python -I root, else PYTHONPATH)

    def cli(self, home: Path, *args: str, stdin: str | None = None, check: bool = True) -> tuple[float, str]:
        """Runs ``memories --home HOME ARGS`` of this tree; returns (wall seconds, stdout)."""
        env = dict(os.environ, PYTHONPATH=str(self.path), NO_COLOR="1")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
                           cwd=self.path, env=env, input=stdin, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if check and p.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-800:]}")
        return seconds, p.stdout

    def start(self, home: Path) -> None:
        self.homes.append(home)
        self.cli(home, "daemon", "start")
        pid = daemon_pid(home)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        roots = [x for x in argv if x[:1] == "/" and Path(x, "memoriesd").is_dir()] if "-I" in argv else \
            [x.removeprefix("PYTHONPATH=") for x in env if x.startswith("PYTHONPATH=")]
        self.code_root = roots[0] if roots else None

    def stop(self, home: Path) -> None:
        pid = daemon_pid(home)
        self.cli(home, "daemon", "stop", check=False)
        if pid is not None and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)  # the daemon this tree started, by its pid
        if home in self.homes:
            self.homes.remove(home)

    def unlock(self, home: Path, vault: str) -> float:
        return self.cli(home, "vault", "unlock", vault, "--passphrase-stdin", stdin=PASSPHRASE)[0]

    def search(self, home: Path, vault: str, query: str, mode: str) -> tuple[float, dict[str, Any]]:
        seconds, out = self.cli(home, "rag", "search", vault, query, "--mode", mode, "--json")
        found = json.loads(out)
        if not found["results"] or found.get("mode", mode) != mode:
            raise RuntimeError(f"{self.name}: {mode} search in {vault}: {str(found)[:300]}")
        return seconds, found

    def status(self, home: Path, vault: str) -> dict[str, Any]:
        return dict(json.loads(self.cli(home, "rag", "status", vault, "--json")[1]))

    def processes(self, home: Path) -> dict[str, Any]:
        """PSS and RSS of the daemon of ``home`` and all its descendants."""
        return processes(json.loads(self.cli(home, "daemon", "status", "--json")[1]))


def write_notes(folder: Path, count: int, paragraphs: int, para_chars: int, seed: int, query: str) -> None:
    """``count`` Markdown notes of ``paragraphs`` paragraphs of made-up words; every 10th names ``query``."""
    rng = random.Random(seed)
    syllables = "ka lo mi ren tas vo quel dor sin pha tru gel bas nor".split()
    vocab = "the of and to in is was for on with as by at from that this it are be or an not".split()
    vocab += ["".join(rng.choices(syllables, k=rng.randint(2, 4))) for _ in range(6000)]
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        paras = []
        for p in range(paragraphs):
            text = f"The {query}" if p == 0 and n % 10 == 0 else "A"
            while len(text) < para_chars:
                text += " " + " ".join(rng.choices(vocab, k=rng.randint(6, 14))) + ". " + rng.choice(vocab).title()
            paras.append(text + " end.")
        (folder / f"note-{n:05d}.md").write_text(f"# Note {n} {vocab[n % len(vocab)]}\n\n" + "\n\n".join(paras) + "\n", "utf-8")


def copy_home(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("run", "logs", "built.json"))
    return dst


def stats(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


# -- 1. unlock -> first BM25 result ---------------------------------------------------------------


def unlock_bench(args: argparse.Namespace, trees: list[Tree], work: Path) -> dict[str, Any]:
    a, src = trees[0], work / "u0"
    src.mkdir()
    write_notes(work / "unotes", args.notes, 1, 300, seed=1, query=args.query)
    log(f"unlock: building a vault of {args.notes} notes (default KDF) with {a.name}")
    a.start(src)
    a.cli(src, "vault", "create", "bench", "--passphrase-stdin", stdin=PASSPHRASE)
    a.cli(src, "rag", "ingest", "bench", str(work / "unotes"), "-r")
    a.search(src, "bench", args.query, "bm25")
    fragments = a.status(src, "bench")["fragments"]
    a.cli(src, "vault", "lock", "--all")
    a.stop(src)

    homes = {t.name: copy_home(src, work / f"u{t.name}") for t in trees}
    for t in trees:
        write_config(homes[t.name], t.settings)
        t.start(homes[t.name])
        wait_idle(homes[t.name])

    def cycle(t: Tree) -> dict[str, float]:
        h = homes[t.name]
        unlock_s = t.unlock(h, "bench")
        search_s, _ = t.search(h, "bench", args.query, "bm25")
        lock_s, _ = t.cli(h, "vault", "lock", "bench")
        wait_idle(h)
        return {"unlock": unlock_s, "search": search_s, "both": unlock_s + search_s, "lock": lock_s}

    runs: dict[str, list[dict[str, float]]] = {t.name: [] for t in trees}
    for t in trees:
        cycle(t)  # warm-up: each tree's own lock leaves its own sealed state
    for r in range(args.repeats):
        for t in trees:
            runs[t.name].append(cycle(t))
        log(f"  round {r + 1}/{args.repeats}: " + ", ".join(f"{t.name} {runs[t.name][-1]['both']:.3f} s" for t in trees))
    for t in trees:
        t.stop(homes[t.name])
    keys = ("unlock", "search", "both", "lock")
    out: dict[str, Any] = {"notes": args.notes, "fragments": fragments, "query": args.query, "repeats": args.repeats}
    out |= {t.name: {k: stats([c[k] for c in runs[t.name]]) for k in keys} for t in trees}
    pairs = list(zip(runs["A"], runs["B"], strict=True))
    out["b_minus_a"] = {k: round(statistics.median(b[k] - a_[k] for a_, b in pairs), 3) for k in keys}
    out["b_over_a_median"] = {k: round(out["B"][k]["median"] / out["A"][k]["median"], 2) for k in keys}
    out["target_b_minus_a_seconds"] = 0.25
    out["within_target"] = out["b_minus_a"]["both"] <= 0.25
    return out


# -- 2. memory of the daemon's processes -----------------------------------------------------------


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, breadth first."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int(stat_fields(d.name)[1]), []).append(int(d.name))
    pids = [root]
    for pid in pids:  # grows while walked
        pids.extend(sorted(children.get(pid, [])))
    return pids


def wait_idle(home: Path, quiet: float = 0.02, timeout: float = 10.0) -> None:
    """Until the daemon of ``home`` and its descendants use under ``quiet`` CPU seconds in 0.25 s."""
    root = daemon_pid(home)
    if root is None:
        return

    def cpu() -> float:
        ticks = 0
        for pid in process_tree(root):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat_fields(pid)
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    deadline, last = time.monotonic() + timeout, cpu()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = cpu()
        if now - last < quiet:
            return
        last = now


def role(pid: int, argv: list[str], status: dict[str, Any]) -> tuple[str, str | None]:
    """(role, vault): from ``daemon status --json`` where it names the process (vault_processes,
    spare_process, model_process), else guessed from the command line."""
    if pid == status["pid"]:
        return "main daemon", None
    for w in status.get("vault_processes") or []:
        if w["pid"] == pid:
            return "vault worker", w["vault_id"]
    if pid in (status.get("spare_process"), status.get("model_process")):
        return ("spare worker" if pid == status.get("spare_process") else "model"), None
    line, vault = " ".join(argv), argv[argv.index("--vault") + 1] if "--vault" in argv[:-1] else None
    if "vault-process" in line:
        return ("vault worker?" if vault else "spare worker?"), vault
    return ("model?" if re.search(r"model|embed|onnx", line, re.IGNORECASE) else "other"), vault


def processes(status: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    pss_kib = rss_kib = 0
    for pid in process_tree(int(status["pid"])):
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
        except OSError:
            continue  # ended meanwhile
        kib = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB", rollup, re.MULTILINE)}
        pss_kib, rss_kib = pss_kib + kib.get("Pss", 0), rss_kib + kib.get("Rss", 0)
        name, vault = role(pid, argv, status)
        row: dict[str, Any] = {"pid": pid, "role": name, "vault": vault}
        row |= {f"{k.lower()}_mib": round(kib.get(k, 0) / 1024, 1) for k in ("Rss", "Pss", "Pss_Anon", "Pss_File")}
        row["cmdline"] = " ".join(a for a in argv if "runpy" not in a)[:160]  # without the boot one-liner
        rows.append(row)
    return {"pss_mib_total": round(pss_kib / 1024, 1), "rss_mib_total": round(rss_kib / 1024, 1),
            "process_count": len(rows), "processes": rows}


def wait_embedded(t: Tree, home: Path, vault: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = t.status(home, vault)
        emb = st["embedding"]
        done, total = (emb.get("embedded") or 0) + (emb.get("skipped") or 0), emb.get("total")
        if total and done >= total and emb.get("state") in ("done", "off", "idle"):
            return st
        if time.monotonic() > deadline:
            raise RuntimeError(f"{t.name}: {vault} not embedded after {timeout:.0f} s: {emb}")
        time.sleep(2)


def build_memory_home(args: argparse.Namespace, a: Tree, model: Settings, work: Path) -> Path:
    """Two embedded vaults in a home built by A, or the one ``--cache`` kept from an earlier run."""
    tag = "-novectors" if args.no_vectors else ""
    src = args.cache.resolve() / f"{Path(args.model_dir).resolve().name}-{args.fragments}{tag}" if args.cache else work / "m0"
    if (src / "built.json").exists():
        log(f"memory: reusing {src}")
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    write_config(src, model, a.settings)
    notes = max(1, round(args.fragments / 4))
    log(f"memory: building 2 vaults of {notes} notes (~{args.fragments} fragments) and embedding them with {a.name}")
    a.start(src)
    built: dict[str, Any] = {}
    for i, v in enumerate(VAULTS):
        write_notes(work / f"mnotes{i}", notes, 4, 500, seed=100 + i, query=args.query)
        a.cli(src, "vault", "create", v, "--passphrase-stdin", stdin=PASSPHRASE)
        a.cli(src, "rag", "ingest", v, str(work / f"mnotes{i}"), "-r")
    for v in VAULTS:
        t0 = time.perf_counter()
        if args.no_vectors:  # the model still loads (queries); each vault's vectors would add ~dims bytes per fragment
            st = a.status(src, v)
            built[v] = {"fragments": st["fragments"], "vectors": 0, "built_by": a.commit}
            continue
        a.cli(src, "rag", "index", v)
        st = wait_embedded(a, src, v, args.embed_timeout)
        built[v] = {"fragments": st["fragments"], "vectors": st["embedding"]["total"],
                    "embed_seconds": round(time.perf_counter() - t0, 1), "built_by": a.commit}
        log(f"  {v}: {built[v]}")
    a.cli(src, "vault", "lock", "--all")
    a.stop(src)
    (src / "config.toml").unlink()
    (src / "built.json").write_text(json.dumps(built), encoding="utf-8")  # last: the home is complete
    return src


def memory_bench(args: argparse.Namespace, trees: list[Tree], work: Path) -> dict[str, Any]:
    model: Settings = {"rag": {"local_model_dir": str(Path(args.model_dir).resolve())}}
    if args.no_vectors:
        model["rag"]["background_index"] = False
    src = build_memory_home(args, trees[0], model, work)
    out: dict[str, Any] = {"model_dir": model["rag"]["local_model_dir"], "vaults": json.loads((src / "built.json").read_text())}
    for t in trees:
        home = copy_home(src, work / f"m{t.name}")
        write_config(home, model, t.settings)
        log(f"memory: {t.name}: unlock both, one hybrid search in each")
        t.start(home)
        wait_idle(home)
        res: dict[str, Any] = {"after_start": t.processes(home)}
        for v in VAULTS:
            t.unlock(home, v)
            t.search(home, v, args.query, "hybrid")
        t0 = time.perf_counter()
        for v in VAULTS:
            emb = (t.status(home, v) if args.no_vectors else wait_embedded(t, home, v, args.embed_timeout))["embedding"]
            res.setdefault("vectors", {})[v] = f"{emb.get('embedded')}/{emb.get('total')}"
        res["vectors_wait_seconds"] = round(time.perf_counter() - t0, 1)  # ~0: the sealed vectors were reused
        for v in VAULTS:  # again, in case waiting for the vectors reloaded anything
            t.search(home, v, args.query, "hybrid")
        time.sleep(args.settle)
        res["unlocked"] = t.processes(home)
        t.cli(home, "vault", "lock", "--all")
        time.sleep(args.settle)
        res["after_lock"] = t.processes(home)
        t.stop(home)
        out[t.name] = res
        log(f"  {t.name}: {res['unlocked']['pss_mib_total']} MiB PSS in {res['unlocked']['process_count']} "
            f"process(es) with both vaults unlocked, {res['after_lock']['pss_mib_total']} MiB after lock")
    ua, ub = out["A"]["unlocked"]["pss_mib_total"], out["B"]["unlocked"]["pss_mib_total"]
    out |= {"b_minus_a_pss_mib": round(ub - ua, 1), "b_over_a_pss": round(ub / ua, 2),
            "targets_mib": {"q4_model": 1024, "fp32_model": 1434}}
    return out


# -- main ----------------------------------------------------------------------------------------


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="e2b544d", help="tree A: this commit, checked out in a temporary git worktree")
    ap.add_argument("--tree-b", type=Path, default=REPO, help="tree B: a source tree (default: this checkout)")
    ap.add_argument("--b-rev", default=None, help="tree B: this commit in a temporary worktree instead")
    ap.add_argument("--set-a", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config.toml for A")
    ap.add_argument("--set-b", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config.toml for B")
    ap.add_argument("--notes", type=int, default=2000, help="unlock part: notes in the vault (one fragment each)")
    ap.add_argument("--repeats", type=int, default=5, help="unlock part: counted rounds (A then B)")
    ap.add_argument("--query", default="lighthouse", help="the word searched (every 10th note holds it)")
    ap.add_argument("--fragments", type=int, default=10000, help="memory part: fragments in each of the 2 vaults")
    ap.add_argument("--model-dir", default="/work/shared/models/all-MiniLM-L6-v2-onnx", help="[rag] local_model_dir")
    ap.add_argument("--cache", type=Path, default=None,
                    help="memory part: keep the embedded vaults' home here (per model dir and --fragments) and reuse it")
    ap.add_argument("--embed-timeout", type=float, default=7200, help="seconds to wait for a vault's vectors")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading /proc")
    ap.add_argument("--no-vectors", action="store_true",
                    help="memory part: index the fragments but embed none ahead (a model too slow to embed 2 x 10k here)")
    ap.add_argument("--skip-unlock", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below

    work = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # short: the daemon's socket path has a length limit
    trees: list[Tree] = []
    result: dict[str, Any] = {"nproc": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        for name, rev, sets in (("A", args.base, args.set_a), ("B", args.b_rev, args.set_b)):
            path = args.tree_b.resolve() if rev is None else work / f"tree{name}"
            if rev is not None:
                git("worktree", "add", "--detach", str(path), rev)
            trees.append(Tree(name, path, git("rev-parse", "HEAD", cwd=path), parse_sets(sets)))
        if not args.skip_unlock:
            result["unlock"] = unlock_bench(args, trees, work)
        if not args.skip_memory:
            result["memory"] = memory_bench(args, trees, work)
        result["trees"] = {t.name: {
            "path": str(t.path), "commit": t.commit, "config": t.settings, "daemon_code_root": t.code_root,
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no", cwd=t.path)),
        } for t in trees}
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(result, indent=2))
    finally:
        for t in trees:
            for home in list(t.homes):
                t.stop(home)
        for path in work.glob("tree?"):
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(path))
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "prune")


if __name__ == "__main__":
    main()
