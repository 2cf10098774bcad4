#!/usr/bin/env python3
"""Encrypted sync through a folder target, on the user's path: the ``memories`` CLI against two real
daemons on two homes (two devices, device A and device B), one machine (issue 30, item 8).

Prints one JSON object on stdout (progress on stderr). Every home has the defaults (production
Argon2id, background indexing) except ``auto_lock_minutes = 0``, and no embedding model: search is
BM25 only, embedding is not what is measured.

1. ``join``: A creates a vault, ``rag ingest``s ``--notes`` Markdown pages of tldr
   (``../shared/eval/tldr.tar.gz``, English pages first), ``sync add`` a folder, ``sync now``. B runs
   ``vault join TARGET --passphrase-stdin`` (timed to its return; then ``memory list --json`` must
   count A's records), then the first ``rag search --mode bm25`` for a known note's description
   (timed; must rank that note first). The alternative, same run: a third home creates the vault
   and ingests the same files itself, then the same search. Ratio = alternative / join.
2. ``change``: both daemons running on the shared folder, ``--rounds`` times: A adds a note with a
   unique word (``memory add``); (a) the command's return -> a new segment file in the folder (A's
   debounce + push; the folder listed every 5 ms), (b) that file's arrival -> B's ``rag.search``
   finds the word (B's watch + pull + index; asked on B's socket every 20 ms, as the CLI asks it),
   then one ``rag search`` through the CLI confirms it. p50 / max. Target: (b) <= 3 s.
3. ``bytes``: every file in the target / the sealed log (A's ``log-*.bin``), after the ingest's push
   and again after ``--edits`` one-note edits (``memory update`` + ``sync now`` each: one small,
   padded segment per edit).
4. ``idle``: with everything settled, the CPU (utime + stime of the router and every process under
   it) each daemon uses in ``--idle`` seconds, with the sync target and again after ``sync remove``.

    .venv/bin/python -m bench.sync [--notes 5000] [--rounds 10] [--edits 200] [--idle 30]
    .venv/bin/python -m bench.sync --notes 300 --rounds 3 --edits 10 --idle 5    # smoke, 2-3 min
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
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from bench.bench_process_shape import process_tree, stat_fields
from bench.bench_unlock_first_answer import REPO, Tree, _kdf_seconds
from bench.eval_beir import Conn

TLDR = REPO.parent / "shared" / "eval" / "tldr.tar.gz"
PASSPHRASE = "sync bench: amber lighthouse forty kites"
VAULT = "bench"
NAME_RE = re.compile(r"^[0-9a-f]{32}$")


def log(msg: str) -> None:
    print(f"[bench.sync] {msg}", file=sys.stderr, flush=True)


def extract_notes(folder: Path, count: int) -> list[Path]:
    """The first ``count`` tldr pages, English first (``tldr/pages/``), then the translations."""
    folder.mkdir(parents=True)
    with tarfile.open(TLDR) as tar:
        members = [
            m for m in tar.getmembers() if m.isfile() and m.name.endswith(".md") and "/pages" in m.name
        ]
        members.sort(key=lambda m: (not m.name.startswith("tldr/pages/"), m.name))
        out: list[Path] = []
        for m in members[:count]:
            data = tar.extractfile(m)
            assert data is not None
            lang, platform, name = m.name.split("/")[-3:]
            path = folder / f"{lang}-{platform}-{name}"
            path.write_bytes(data.read())
            out.append(path)
    return out


def known_query(note: Path) -> str:
    """A note's description (its first ``>`` line): the words that should find it first."""
    for line in note.read_text("utf-8").splitlines():
        if line.startswith(">") and len(line) > 20:
            return re.sub(r"[^\w\s-]", " ", line[1:]).strip()
    raise SystemExit(f"{note.name}: no description line")


def target_files(target: Path) -> dict[str, int]:
    """The engine's files in the target (32-hex names and the header), name -> size."""
    return {
        e.name: e.stat().st_size
        for e in os.scandir(target)
        if e.is_file() and (NAME_RE.match(e.name) or e.name == "memories-sync.json")
    }


def log_bytes(home: Path, vid: str) -> int:
    return sum(p.stat().st_size for p in (home / "vaults" / vid).glob("log-*.bin"))


def records(t: Tree) -> int:
    return int(json.loads(t.cli("memory", "list", VAULT, "--limit", "1", "--json")[1])["total"])


def search(t: Tree, query: str) -> tuple[float, list[dict[str, Any]]]:
    dt, out = t.cli("rag", "search", VAULT, query, "--mode", "bm25", "--json")
    return dt, json.loads(out)["results"]


def found(results: list[dict[str, Any]], needle: str) -> bool:
    """Whether the first result is the note ``needle`` names (its file name or its title)."""
    if not results:
        return False
    top = results[0]
    return needle in str(top.get("source") or "") or needle in str(top.get("title") or "")


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 3), "max": round(max(xs), 3), "min": round(min(xs), 3)}


def start_home(name: str, home: Path) -> Tree:
    home.mkdir(parents=True, mode=0o700)
    (home / "config.toml").write_text("[daemon]\nauto_lock_minutes = 0\n")
    t = Tree(name, REPO, home)
    t.start()
    return t


def bench_join(a: Tree, b: Tree, alt_home: Path, notes: Path, target: Path, known: Path) -> dict[str, Any]:
    query = known_query(known)
    log(f"A creates the vault and ingests {notes} (load {os.getloadavg()[0]:.2f})")
    create_s, out = a.cli("vault", "create", VAULT, "--passphrase-stdin", stdin=PASSPHRASE + "\n")
    vid = out.split()[-1]
    ingest_s, _ = a.cli("rag", "ingest", VAULT, str(notes), "-r", "--json")
    a.wait_idle(quiet=1.0)
    a_records = records(a)
    add_s, _ = a.cli("sync", "add", VAULT, str(target))  # its first push starts in the background
    now_s, out = a.cli("sync", "now", VAULT, "--json")  # waits for it, then finds nothing left to push
    push_s = add_s + now_s
    if "error" in json.loads(out)["vaults"][0]["results"]["t1"]:
        raise SystemExit(f"A's push failed: {out}")
    pushed = json.loads(a.cli("sync", "status", VAULT, "--json")[1])["vaults"][0]["targets"][0]
    a.wait_idle(quiet=1.0)
    on_target = target_files(target)
    log(f"A pushed {a_records} records in {push_s:.1f} s: {len(on_target)} files; B joins")
    join_s, out = b.cli("vault", "join", str(target), "--passphrase-stdin", stdin=PASSPHRASE + "\n")
    if out.split()[-1] != vid:
        raise SystemExit(f"B joined {out.split()[-1]}, not {vid}")
    b_records = records(b)
    search_s, results = search(b, query)
    joined = {
        "join_seconds": round(join_s, 3),
        "records_after_join": b_records,
        "all_records_readable": b_records == a_records,
        "first_bm25_search_seconds": round(search_s, 3),
        "join_to_first_answer_seconds": round(join_s + search_s, 3),
        "known_note_first": found(results, known.name),
    }
    b.wait_idle(quiet=1.0)
    log(f"join {join_s:.2f} s + search {search_s:.2f} s; the alternative: B ingests the files itself")
    alt = start_home("alternative", alt_home)
    try:
        alt_create_s, _ = alt.cli("vault", "create", VAULT, "--passphrase-stdin", stdin=PASSPHRASE + "\n")
        alt_ingest_s, _ = alt.cli("rag", "ingest", VAULT, str(notes), "-r", "--json")
        alt_search_s, alt_results = search(alt, query)
    finally:
        alt.stop()
    alt_total = alt_create_s + alt_ingest_s + alt_search_s
    return {
        "vault_id": vid,
        "notes": len(list(notes.iterdir())),
        "records_on_a": a_records,
        "known_note": known.name,
        "query": query,
        "a": {
            "create_seconds": round(create_s, 3),
            "ingest_seconds": round(ingest_s, 3),
            "sync_add_to_pushed_seconds": round(push_s, 3),
            "pending_after_push": pushed.get("pending"),
        },
        "b_join": joined,
        "b_alternative_create_and_ingest": {
            "create_seconds": round(alt_create_s, 3),
            "ingest_seconds": round(alt_ingest_s, 3),
            "first_bm25_search_seconds": round(alt_search_s, 3),
            "create_to_first_answer_seconds": round(alt_total, 3),
            "known_note_first": found(alt_results, known.name),
        },
        "alternative_over_join": round(alt_total / (join_s + search_s), 2),
        "target_after_push": {"files": len(on_target), "bytes": sum(on_target.values())},
    }


def wait_new_segment(target: Path, before: set[str], timeout: float = 60.0) -> tuple[float, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = set(target_files(target)) - before
        if new:
            return time.perf_counter(), sorted(new)[0]
        time.sleep(0.005)
    raise SystemExit("no new segment reached the target")


def wait_searchable(conn: Conn, vid: str, word: str, timeout: float = 60.0) -> tuple[float, int]:
    deadline, asked = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        asked += 1
        out = conn.call(
            "rag.search", {"vault": vid, "query": word, "mode": "bm25", "limit": 1, "no_rerank": True}
        )
        if out["results"]:
            return time.perf_counter(), asked
        time.sleep(0.02)
    raise SystemExit(f"B never found {word}")


def bench_change(a: Tree, b: Tree, vid: str, target: Path, rounds: int) -> dict[str, Any]:
    conn = Conn(b.home / "run" / "memoriesd.sock")
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        a.wait_idle(quiet=1.0, timeout=120)
        b.wait_idle(quiet=1.0, timeout=120)
        word = f"zq{os.getpid()}x{r}syncword"
        before = set(target_files(target))
        a.cli("memory", "add", VAULT, "--title", f"change {r}", f"a one-note change carrying {word}")
        returned = time.perf_counter()
        arrived, name = wait_new_segment(target, before)
        searchable, asked = wait_searchable(conn, vid, word)
        cli_s, results = search(b, word)
        rows.append(
            {
                "a_return_to_file_seconds": round(arrived - returned, 3),
                "file_to_b_searchable_seconds": round(searchable - arrived, 3),
                "segment_bytes": target_files(target).get(name),
                "b_socket_searches": asked,
                "b_cli_search_seconds": round(cli_s, 3),
                "b_cli_found": bool(results),
                "loadavg_1min": round(os.getloadavg()[0], 2),
            }
        )
        log(
            f"round {r + 1}: A's debounce+push {rows[-1]['a_return_to_file_seconds']} s, "
            f"file -> B searchable {rows[-1]['file_to_b_searchable_seconds']} s"
        )
    b_side = [x["file_to_b_searchable_seconds"] for x in rows]
    return {
        "rounds": rows,
        "a_return_to_file_seconds": stats([x["a_return_to_file_seconds"] for x in rows]),
        "file_to_b_searchable_seconds": stats(b_side),
        "within_3s": max(b_side) <= 3.0,
    }


def segment_anatomy(home: Path, vid: str, path: Path) -> dict[str, int]:
    """One segment's sizes, opened with the vault's key (this process derives it once): the file,
    the padded plaintext, the zlib body inside it and the JSON it holds."""
    from memoriesd.sync.segments import MAGIC, Codec
    from memoriesd.vault.format import parse_header
    from memoriesd.vault.keys import VaultKeys
    from memoriesd.vault.keywrap import unwrap_key

    header = parse_header(json.loads((home / "vaults" / vid / "header.json").read_text()), vid)
    codec = Codec(VaultKeys(unwrap_key(header, PASSPHRASE.encode())), vid)
    data = path.read_bytes()
    padded = codec._sealer.open(
        data[len(MAGIC) + 1 :], codec._aad(data[len(MAGIC) : len(MAGIC) + 1].decode())
    )
    body = int.from_bytes(padded[:4], "big")
    plain = zlib.decompress(padded[4 : 4 + body])
    return {"file": len(data), "padded": len(padded), "zlib": body, "json": len(plain)}


def bench_edits(a: Tree, vid: str, target: Path, edits: int, base: dict[str, int]) -> dict[str, Any]:
    """``edits`` updates of one note, each pushed at once by ``sync now`` (one segment each)."""
    a.wait_idle(quiet=1.0, timeout=120)
    rid = json.loads(a.cli("memory", "add", VAULT, "--title", "edited", "revision 0", "--json")[1])["id"]
    a.cli("sync", "now", VAULT)
    t0, log0, files0 = time.perf_counter(), log_bytes(a.home, vid), target_files(target)
    for i in range(1, edits + 1):
        a.cli("memory", "update", VAULT, rid, f"revision {i} of the edited note, a few words longer")
        a.cli("sync", "now", VAULT)
    a.wait_idle(quiet=1.0, timeout=120)
    files1, log1 = target_files(target), log_bytes(a.home, vid)
    new = {n: s for n, s in files1.items() if n not in files0}
    on_target = sum(files1.values())
    return {
        "edits": edits,
        "seconds": round(time.perf_counter() - t0, 1),
        "new_files": len(new),
        "new_file_bytes": stats([float(s) for s in new.values()]) if new else None,
        "log_bytes_added": log1 - log0,
        "target_bytes_added": on_target - sum(files0.values()),
        "one_edit_segment": segment_anatomy(a.home, vid, target / max(new)) if new else None,
        "edits_target_over_log": round((on_target - sum(files0.values())) / max(1, log1 - log0), 2),
        "total": {
            "target_bytes": on_target,
            "log_bytes": log1,
            "target_over_log": round(on_target / log1, 3),
        },
        "before": base,
    }


def pid_cpu(t: Tree) -> dict[str, float]:
    """CPU seconds of each process of a daemon, keyed by role: router, vault, spare, other."""
    assert t.proc is not None
    status = t.status()
    roles = {w["pid"]: "vault" for w in status.get("vault_processes") or []}
    roles |= {status.get("spare_process"): "spare", t.proc.pid: "router"}
    out: dict[str, float] = {}
    for pid in process_tree(t.proc.pid):
        try:
            f = stat_fields(pid)
        except (OSError, IndexError, ValueError):
            continue
        key = f"{roles.get(pid, 'other')}:{pid}"
        out[key] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


def idle_cpu(trees: list[Tree], seconds: float) -> dict[str, Any]:
    for t in trees:
        t.wait_idle(quiet=1.0, timeout=120)
    before = {t.name: pid_cpu(t) for t in trees}
    time.sleep(seconds)  # the measured window itself, not a synchronisation
    after = {t.name: pid_cpu(t) for t in trees}
    per = {n: {k: round((v - before[n].get(k, 0.0)) * 1000, 1) for k, v in after[n].items()} for n in after}
    return {
        "cpu_ms": {n: round(sum(p.values()), 1) for n, p in per.items()},
        "per_process_ms": per,
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--edits", type=int, default=200)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of the idle CPU window")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temp dir, removed)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bsync"))
    if args.work:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().strip(),
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "settings": "defaults (production Argon2id), auto_lock_minutes = 0, [sync] debounce 1 s",
        "model": "none installed: BM25 search only (embedding is not what is measured)",
        "target": "a folder on this machine, shared by both homes",
        # The production Argon2id derivation alone (median of 3, this process): a join and a
        # `vault create` each run one, so it is the floor of both.
        "kdf_seconds": _kdf_seconds(),
    }
    notes = extract_notes(work / "notes", args.notes)
    known = notes[len(notes) // 2]
    target = work / "target"
    a = start_home("A", work / "a")
    b = start_home("B", work / "b")
    try:
        result["join"] = j = bench_join(a, b, work / "alt", work / "notes", target, known)
        vid = j["vault_id"]
        log_after_push = log_bytes(a.home, vid)
        result["bytes"] = {
            "after_push": {
                "target_bytes": j["target_after_push"]["bytes"],
                "log_bytes": log_after_push,
                "target_over_log": round(j["target_after_push"]["bytes"] / log_after_push, 3),
            }
        }
        result["change"] = bench_change(a, b, vid, target, args.rounds)
        result["bytes"]["edits"] = bench_edits(a, vid, target, args.edits, result["bytes"]["after_push"])
        log(f"idle {args.idle} s with sync, then without")
        with_sync = idle_cpu([a, b], args.idle)
        for t in (a, b):
            t.cli("sync", "remove", VAULT, "t1")
        without = idle_cpu([a, b], args.idle)
        result["idle"] = {
            "seconds": args.idle,
            "with_sync": with_sync,
            "without_sync": without,
            "extra_ms_per_30s": {
                t: round((with_sync["cpu_ms"][t] - without["cpu_ms"][t]) * 30 / args.idle, 1)
                for t in with_sync["cpu_ms"]
            },
        }
    finally:
        for t in (a, b):
            t.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result["loadavg_at_end"] = Path("/proc/loadavg").read_text().strip()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
