#!/usr/bin/env python3
"""Benchmark the vault through the real daemon and the real CLI; prints one JSON object on stdout.

Measured (on a throw-away home under /tmp, with a real ``memoriesd`` process):

- unlock: an empty vault with the default Argon2id parameters (and the KDF alone, in-process), and a
  vault holding ``--records`` records of 1 KB each (so the cost of loading the log is visible);
- add / read latency p50/p95 through the CLI (one subprocess per call, like a user) and through the
  socket (framed requests on one persistent connection; reads also with a new connection each);
- writes per second through the socket: sequential, and with 8 concurrent clients;
- compaction of the full vault after updating ~10 % of its records and deleting ~5 %;
- cold start of ``memories --help`` next to ``python -c pass`` (medians and their ratio), the
  heaviest imports of the CLI, and a check that importing ``memories_cli.main`` pulls in none of
  numpy, onnxruntime, jieba or tokenizers.

Progress goes to stderr. Usage::

    .venv/bin/python -m bench.bench_vault [--records 10000] [--quick] [--keep-home]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from memoriesd.server import protocol  # noqa: E402

PASSPHRASE = "bench correct horse battery staple"
HEAVY_MODULES = ("numpy", "onnxruntime", "jieba", "tokenizers")
CONCURRENT_CLIENTS = 8
WORDS = (
    "vault daemon record memory local first encrypted socket argon key note idea travel recipe meeting "
    "garden book music river mountain letter project budget family health train coffee window winter"
).split()

# The daemon's own settings for the run; the KDF is left at its defaults on purpose.
CONFIG = """
[daemon]
autostart = false
auto_lock_minutes = 0
"""


def log(msg: str) -> None:
    print(f"[bench_vault] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency(samples: list[float]) -> dict[str, Any]:
    """Seconds in, milliseconds out."""
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 50) * 1000, 3),
        "p95_ms": round(percentile(samples, 95) * 1000, 3),
        "mean_ms": round(statistics.fmean(samples) * 1000, 3),
        "max_ms": round(max(samples) * 1000, 3),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------------------- daemon and protocol


class BenchError(RuntimeError):
    pass


class Conn:
    """One persistent framed connection to the daemon."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.next_id = 1

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(protocol.encode({"id": rid, "method": method, "params": params or {}}))
        while True:
            msg = protocol.recv_frame(self.sock)
            if "progress" in msg:
                continue
            if "error" in msg:
                err = msg["error"] or {}
                raise BenchError(f"{method} failed: {err.get('code')}: {err.get('message')}")
            return msg["result"]

    def close(self) -> None:
        self.sock.close()


class Daemon:
    """A real memoriesd process on the benchmark home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None
        self.err_path = home / "daemon.stderr"

    @property
    def socket_path(self) -> Path:
        return self.home / "run" / "memoriesd.sock"

    def start(self, timeout: float = 60.0) -> float:
        env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
        t0 = time.perf_counter()
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memoriesd.main", "--home", str(self.home)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=str(REPO),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the daemon exited: {self.err_path.read_text('utf-8', 'replace')[-2000:]}")
            if self.socket_path.exists():
                try:
                    c = Conn(self.socket_path)
                    try:
                        c.call("daemon.status")
                    finally:
                        c.close()
                    return time.perf_counter() - t0
                except (OSError, ConnectionError):
                    pass
            time.sleep(0.01)
        raise BenchError("the daemon did not answer in time")

    def rss_mib(self) -> float | None:
        if self.proc is None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            return None
        return None

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_idle(self, timeout: float = 60.0, quiet: float = 0.5) -> float:
        """Wait until the daemon has used no CPU for ``quiet`` seconds (its start-up warm-up is over).

        Returns the seconds waited. Measuring while the daemon still loads jieba's dictionary in a
        background thread would charge that to whatever is timed first.
        """
        t0 = time.perf_counter()
        last = self.cpu_seconds()
        still_since = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            time.sleep(0.1)
            now = self.cpu_seconds()
            if now - last > 0.011:
                still_since = time.perf_counter()
            last = now
            if time.perf_counter() - still_since >= quiet:
                return still_since - t0
        return time.perf_counter() - t0

    def stop(self) -> float | None:
        """SIGTERM to our own daemon process; seconds until it exited."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.perf_counter() - t0


def body_1kb(rng: random.Random) -> str:
    """About 1,024 bytes of ASCII words, different for every record."""
    words: list[str] = []
    size = 0
    while size < 1024:
        w = rng.choice(WORDS) + str(rng.randrange(1000))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:1024]


# ---------------------------------------------------------------------------- CLI start-up


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def median_run(cmd: list[str], runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, cwd=str(REPO), stdin=subprocess.DEVNULL, timeout=120)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise BenchError(f"{' '.join(cmd[-2:])} exited with {r.returncode}: {r.stderr.decode()[-500:]}")
    return {"median_ms": round(statistics.median(times) * 1000, 1), "min_ms": round(min(times) * 1000, 1), "runs": runs}


def heaviest_imports(home: Path, *cli_args: str, top: int = 8) -> list[dict[str, Any]]:
    """Outermost imports by cumulative time during one CLI run (``-X importtime``, depth 0)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memories_cli.main", "--home", str(home), *cli_args],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=120,
    )
    rows: list[dict[str, Any]] = []
    pat = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|( *)(\S+)")
    for line in r.stderr.splitlines():
        m = pat.match(line)
        if m and len(m.group(3)) == 1:  # depth 0: imported directly by the CLI or the interpreter
            rows.append({"module": m.group(4), "cumulative_ms": round(int(m.group(2)) / 1000, 1)})
    rows.sort(key=lambda x: -float(x["cumulative_ms"]))
    return rows[:top]


def cli_startup(home: Path, runs: int) -> dict[str, Any]:
    log(f"CLI start-up: {runs} runs each of `python -c pass` and `memories --help`")
    base = median_run([sys.executable, "-c", "pass"], runs)
    helped = median_run([sys.executable, "-m", "memories_cli.main", "--home", str(home), "--help"], runs)
    out: dict[str, Any] = {
        "python_c_pass": base,
        "memories_help": helped,
        "ratio_help_over_python": round(helped["median_ms"] / base["median_ms"], 2),
        "help_minus_python_ms": round(helped["median_ms"] - base["median_ms"], 1),
    }
    script = Path(sys.executable).parent / "memories"
    if script.exists():
        out["memories_script_help"] = median_run([str(script), "--home", str(home), "--help"], runs)
    # --version parses the command line and exits: help rendering (rich) is what --help adds on top.
    out["memories_version"] = median_run([sys.executable, "-m", "memories_cli.main", "--version"], runs)
    out["heaviest_imports_during_help"] = heaviest_imports(home, "--help")
    probe = (
        "import json, sys; import memories_cli.main; "
        f"print(json.dumps({{'loaded': [m for m in {HEAVY_MODULES!r} if m in sys.modules], 'modules': len(sys.modules)}}))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    if r.returncode != 0:
        raise BenchError(f"importing memories_cli.main failed: {r.stderr[-500:]}")
    doc = json.loads(r.stdout)
    out["heavy_imports"] = {
        "checked": list(HEAVY_MODULES),
        "imported": doc["loaded"],
        "ok": not doc["loaded"],
        "modules_after_import": doc["modules"],
    }
    return out


# ---------------------------------------------------------------------------- phases


def kdf_only(runs: int) -> dict[str, Any]:
    """Argon2id alone with the default parameters, in this process (what every unlock pays)."""
    from memoriesd.config import VaultConfig
    from memoriesd.vault import crypto

    v = VaultConfig()
    times = []
    for _ in range(runs):
        salt = crypto.random_bytes(crypto.SALT_BYTES)
        t0 = time.perf_counter()
        kek = crypto.derive_kek(
            PASSPHRASE.encode(), salt, memory_kib=v.kdf_memory_kib, iterations=v.kdf_iterations, lanes=v.kdf_lanes
        )
        times.append(time.perf_counter() - t0)
        crypto.wipe(kek)
    return {"median_ms": round(statistics.median(times) * 1000, 1), "runs": runs}


def unlock_runs(conn: Conn, vault: str, runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        conn.call("vault.lock", {"vault": vault})
        t, _ = timed(lambda: conn.call("vault.unlock", {"vault": vault, "passphrase": PASSPHRASE}))
        times.append(t)
    return {
        "median_ms": round(statistics.median(times) * 1000, 1),
        "min_ms": round(min(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "runs": runs,
    }


def add_sequential(conn: Conn, vault: str, n: int, rng: random.Random) -> tuple[list[float], list[str], float]:
    samples, ids = [], []
    t_start = time.perf_counter()
    for i in range(n):
        params = {"vault": vault, "title": f"note {rng.randrange(10**6)}", "body": body_1kb(rng)}
        t0 = time.perf_counter()
        out = conn.call("memory.add", params)
        samples.append(time.perf_counter() - t0)
        ids.append(out["id"])
        if i and i % 1000 == 0:
            log(f"  {i}/{n}")
    return samples, ids, time.perf_counter() - t_start


def add_concurrent(path: Path, vault: str, total: int, clients: int, seed: int) -> tuple[list[float], list[str], float]:
    """``clients`` threads, each with its own connection, adding ``total`` records between them."""
    per = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    barrier = threading.Barrier(clients + 1)
    results: list[tuple[list[float], list[str]]] = [([], []) for _ in range(clients)]
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        bodies = [body_1kb(rng) for _ in range(per[k])]
        conn = Conn(path)
        try:
            barrier.wait()
            samples, ids = results[k]
            for body in bodies:
                t0 = time.perf_counter()
                out = conn.call("memory.add", {"vault": vault, "title": f"c{k}", "body": body})
                samples.append(time.perf_counter() - t0)
                ids.append(out["id"])
        except BaseException as exc:  # reported after the join
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise BenchError(f"a concurrent client failed: {errors[0]}")
    return [s for r in results for s in r[0]], [i for r in results for i in r[1]], elapsed


def cli_adds(home: Path, vault: str, n: int, rng: random.Random) -> tuple[list[float], list[str]]:
    samples, ids = [], []
    for _ in range(n):
        body = body_1kb(rng)
        t0 = time.perf_counter()
        r = run_cli(home, "--json", "memory", "add", vault, body, "--title", "cli note")
        samples.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise BenchError(f"memories memory add failed: {r.stderr.strip()[-500:]}")
        ids.append(json.loads(r.stdout)["id"])
    return samples, ids


def cli_reads(home: Path, vault: str, ids: list[str]) -> list[float]:
    samples = []
    for rid in ids:
        t0 = time.perf_counter()
        r = run_cli(home, "--json", "memory", "read", vault, rid)
        samples.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise BenchError(f"memories memory read failed: {r.stderr.strip()[-500:]}")
    return samples


def socket_reads(conn: Conn, vault: str, ids: list[str]) -> list[float]:
    samples = []
    for rid in ids:
        t0 = time.perf_counter()
        conn.call("memory.read", {"vault": vault, "id": rid})
        samples.append(time.perf_counter() - t0)
    return samples


def socket_reads_new_connection(path: Path, vault: str, ids: list[str]) -> list[float]:
    """Connect, one request, close: the daemon-side cost the CLI pays per command."""
    samples = []
    for rid in ids:
        t0 = time.perf_counter()
        c = Conn(path)
        try:
            c.call("memory.read", {"vault": vault, "id": rid})
        finally:
            c.close()
        samples.append(time.perf_counter() - t0)
    return samples


def vault_header_kdf(home: Path, vault_id: str) -> dict[str, Any]:
    for p in (home / "vaults" / vault_id).iterdir():
        if p.name.startswith("header"):
            try:
                kdf = json.loads(p.read_text("utf-8")).get("kdf", {})
                return {k: kdf[k] for k in ("alg", "memory_kib", "iterations", "lanes") if k in kdf}
            except (OSError, ValueError):
                pass
    return {}


# ---------------------------------------------------------------------------- main


def plan(args: argparse.Namespace) -> dict[str, int]:
    if args.quick:
        p = {"records": 400, "lat": 60, "seq": 60, "conc": 80, "cli": 5, "reads": 100, "reads_new": 50,
             "startup_runs": 3, "unlock_runs": 2}
    else:
        p = {"records": 10000, "lat": 1000, "seq": 1000, "conc": 2000, "cli": 30, "reads": 1000, "reads_new": 300,
             "startup_runs": 10, "unlock_runs": 3}
    if args.records is not None:
        p["records"] = args.records
    return p


def bench(home: Path, p: dict[str, int], rng: random.Random) -> dict[str, Any]:
    result: dict[str, Any] = {"plan": p}
    result["cli_startup"] = cli_startup(home, p["startup_runs"])

    daemon = Daemon(home)
    log("starting memoriesd")
    result["daemon_start_ms"] = round(daemon.start() * 1000, 1)
    busy = daemon.wait_idle()
    result["daemon_busy_after_start_ms"] = round(busy * 1000, 1)
    result["daemon_cpu_after_start_s"] = round(daemon.cpu_seconds(), 2)
    result["daemon_rss_mib"] = {"idle": daemon.rss_mib()}
    conn = Conn(daemon.socket_path)
    try:
        # ---- unlock with the default KDF, empty vault
        log("unlock, empty vault (default Argon2id)")
        t, out = timed(lambda: conn.call("vault.create", {"name": "empty", "passphrase": PASSPHRASE}))
        empty_id = out["vault_id"]
        unlock: dict[str, Any] = {
            "kdf": vault_header_kdf(home, empty_id),
            "create_empty_ms": round(t * 1000, 1),
            "kdf_only_in_process": kdf_only(p["unlock_runs"]),
            "empty_vault": unlock_runs(conn, "empty", p["unlock_runs"]),
        }
        conn.call("vault.lock", {"vault": "empty"})
        result["unlock"] = unlock

        # ---- writes through the socket
        conn.call("vault.create", {"name": "bench", "passphrase": PASSPHRASE})
        ids: list[str] = []
        log(f"socket add latency: {p['lat']} sequential adds")
        lat, new, _ = add_sequential(conn, "bench", p["lat"], rng)
        ids += new
        log(f"socket writes/s sequential: {p['seq']} adds")
        seq_samples, new, seq_elapsed = add_sequential(conn, "bench", p["seq"], rng)
        ids += new
        log(f"socket writes/s with {CONCURRENT_CLIENTS} clients: {p['conc']} adds")
        conc_samples, new, conc_elapsed = add_concurrent(daemon.socket_path, "bench", p["conc"], CONCURRENT_CLIENTS, 1)
        ids += new
        log(f"CLI add latency: {p['cli']} subprocesses")
        cli_add_samples, new = cli_adds(home, "bench", p["cli"], rng)
        ids += new
        rest = max(0, p["records"] - len(ids))
        log(f"filling the vault with {rest} more records ({CONCURRENT_CLIENTS} clients)")
        fill_elapsed = 0.0
        if rest:
            _, new, fill_elapsed = add_concurrent(daemon.socket_path, "bench", rest, CONCURRENT_CLIENTS, 2)
            ids += new
        status = conn.call("vault.status", {"vault": "bench"})
        result["vault"] = {"records": status["records"], "log_bytes": status["log_bytes"],
                           "bytes_per_record": round(status["log_bytes"] / max(1, status["records"]), 1)}
        result["daemon_rss_mib"]["full_vault"] = daemon.rss_mib()
        result["writes"] = {
            "socket_add_latency": latency(lat),
            "sequential": {"n": p["seq"], "seconds": round(seq_elapsed, 3),
                           "writes_per_second": round(p["seq"] / seq_elapsed, 1), "latency": latency(seq_samples)},
            "concurrent": {"clients": CONCURRENT_CLIENTS, "n": p["conc"], "seconds": round(conc_elapsed, 3),
                           "writes_per_second": round(p["conc"] / conc_elapsed, 1), "latency": latency(conc_samples)},
            "cli_add_latency": latency(cli_add_samples),
        }
        if rest:
            result["writes"]["fill"] = {"n": rest, "seconds": round(fill_elapsed, 3),
                                        "writes_per_second": round(rest / fill_elapsed, 1)}

        # ---- reads
        log(f"socket read latency: {p['reads']} reads")
        sample_ids = [rng.choice(ids) for _ in range(p["reads"])]
        result["reads"] = {
            "socket_read_latency": latency(socket_reads(conn, "bench", sample_ids)),
            "socket_read_new_connection_latency": latency(
                socket_reads_new_connection(daemon.socket_path, "bench", sample_ids[: p["reads_new"]])
            ),
        }
        log(f"CLI read latency: {p['cli']} subprocesses")
        result["reads"]["cli_read_latency"] = latency(cli_reads(home, "bench", [rng.choice(ids) for _ in range(p["cli"])]))
        # A real command imports more than --help/--version does (typer's parameter coercion).
        result["reads"]["cli_read_heaviest_imports"] = heaviest_imports(home, "--json", "memory", "read", "bench", ids[0])

        # ---- unlock the full vault
        log(f"unlock, vault of {status['records']} records")
        unlock["full_vault"] = unlock_runs(conn, "bench", p["unlock_runs"]) | {"records": status["records"]}
        unlock["full_minus_empty_ms"] = round(unlock["full_vault"]["median_ms"] - unlock["empty_vault"]["median_ms"], 1)
        t, _ = timed(lambda: conn.call("memory.read", {"vault": "bench", "id": ids[0]}))
        unlock["first_read_after_unlock_ms"] = round(t * 1000, 3)

        # ---- updates, deletes, compaction
        n_upd = max(1, len(ids) // 10)
        n_del = max(1, len(ids) // 20)
        shuffled = ids[:]
        rng.shuffle(shuffled)
        upd_ids, del_ids = shuffled[:n_upd], shuffled[n_upd : n_upd + n_del]
        log(f"compaction: updating {n_upd}, deleting {n_del}")
        upd = []
        for rid in upd_ids:
            params = {"vault": "bench", "id": rid, "body": body_1kb(rng)}
            t0 = time.perf_counter()
            conn.call("memory.update", params)
            upd.append(time.perf_counter() - t0)
        dele = []
        for rid in del_ids:
            t0 = time.perf_counter()
            conn.call("memory.delete", {"vault": "bench", "id": rid})
            dele.append(time.perf_counter() - t0)
        before = conn.call("vault.status", {"vault": "bench"})
        t, stats = timed(lambda: conn.call("vault.compact", {"vault": "bench"}))
        after = conn.call("vault.status", {"vault": "bench"})
        result["compaction"] = {
            "updated": n_upd,
            "deleted": n_del,
            "update_latency": latency(upd),
            "delete_latency": latency(dele),
            "seconds_client": round(t, 3),
            "seconds_daemon": stats.get("seconds"),
            "revisions_before": stats.get("revisions_before"),
            "revisions_after": stats.get("revisions_after"),
            "log_bytes_before": before["log_bytes"],
            "log_bytes_after": after["log_bytes"],
            "records_after": after["records"],
        }
        result["compaction"]["unlock_after_compaction"] = unlock_runs(conn, "bench", p["unlock_runs"])
        result["daemon_rss_mib"]["after_compaction"] = daemon.rss_mib()
        conn.call("vault.lock", {"all": True})
        result["daemon_rss_mib"]["all_locked"] = daemon.rss_mib()
    finally:
        conn.close()
        stopped = daemon.stop()
        result["daemon_stop_ms"] = round(stopped * 1000, 1) if stopped is not None else None
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--records", type=int, default=None, help="records in the big vault (default 10000; 400 with --quick)")
    ap.add_argument("--quick", action="store_true", help="small numbers for a smoke run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep-home", action="store_true", help="leave the throw-away home in place")
    args = ap.parse_args()
    p = plan(args)
    # AF_UNIX paths are limited to 107 bytes: the home lives directly under /tmp.
    root = Path(tempfile.mkdtemp(prefix="mbv", dir="/tmp"))
    home = root / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(CONFIG)
    log(f"home {home}")
    t0 = time.perf_counter()
    try:
        result = bench(home, p, random.Random(args.seed))
    finally:
        if args.keep_home:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": sys.platform}
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
