"""The ``first_result`` part of ``bench_first_search.py``: unlock -> first BM25 result and unlock ->
first vector result, at default settings, for one vault size, before/after in the same run.

Imported by ``bench_first_search.py`` (see its docstring); not run on its own.

Vectors come from a real HTTP embedding service on 127.0.0.1 (``tests/embed_server.py``, the
OpenAI-compatible protocol the daemon's ``[rag.embedding]`` client speaks) answering deterministic
768-dimension bag-of-words vectors: embedding 100,000 fragments with a real model takes hours on
this machine, and what is measured here (unlocking, restoring the sealed lexical snapshot, reading
the sealed vector sidecar into the in-memory index) does not depend on what the vectors mean. The
query's own embedding is one request to that service: it is reported apart (``query_embed_ms``,
from the daemon's timings) and subtracted from the ``..._excl_query`` figures.

Variants, each its own daemon on its own copy of the vault, measured in turn in every cycle so that
they share the machine's load:

- ``current``: this tree;
- ``whole_file_vectors``: this tree with ``MEMORIES_BENCH_WHOLE_FILE_VECTORS=1`` (the sidecar read
  whole and decoded to float32 before the index converts it, as before streaming);
- ``baseline`` (with ``--baseline-tree``): the daemon of another source tree, e.g. the last commit
  before a change (``git archive HEAD | tar -x -C /tmp/base``); its copy of the vault first gets
  a lexical snapshot of that tree's own format (the current one would be stale for it) and, when
  that tree predates version-2 sidecars (int8 rows), its vector sidecar rewritten as version 1
  (float32 rows, as that tree wrote it). After the cycles, ``upgrade``: this tree's daemon on that
  version-1 copy, unlock -> first vector result, which reads the float32 rows and rewrites the file
  once as version 2.

``sealed_bytes_per_fragment``: the vector sidecar's and the whole vault directory's bytes on disk
divided by the fragments (``baseline_...``: the same for the baseline's copy, version-1 sidecar).
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

from bench.eval_beir import PASSPHRASE, Conn  # noqa: E402
from bench.lexical_first_search import FIRST_QUERY, write_notes  # noqa: E402
from tests.embed_server import EmbeddingService  # noqa: E402

DIMS = 768  # EmbeddingGemma's width: the sidecar and the int8 index as the product's default model makes them
_LOADED = re.compile(r"loaded (\d+) sealed vectors in ([\d.]+) s")
_RESTORED = re.compile(r"restored from its sealed snapshot \((\d+) fragments")


def _config(svc: EmbeddingService) -> str:
    # Default KDF, caps and vector precision; only: no auto-lock, no silent embedding at search,
    # and a long budget for the initial `rag index`.
    return (
        "[daemon]\nauto_lock_minutes = 0\n"
        "[rag]\noperation_budget_seconds = 3600\non_demand_embed_limit = 0\n" + svc.config()
    )


class Daemon:
    """A daemon of one source tree on one home."""

    def __init__(self, tree: Path, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.last_cpu = 0.0
        run_env = dict(os.environ, PYTHONPATH=str(tree), ORT_DISABLE_TELEMETRY="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memoriesd.main", "--home", str(home)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(tree), env=run_env,
        )
        sock = home / "run" / "memoriesd.sock"
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon failed: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            if sock.exists():
                try:
                    self.conn = Conn(sock)
                    self.conn.call("daemon.status", {})
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise SystemExit("daemon did not start")
            time.sleep(0.05)
        self.vid = self.conn.call("vault.list", {})["vaults"][0]["vault_id"] if self.has_vault() else ""

    def has_vault(self) -> bool:
        return any((self.home / "vaults").glob("*/header.json"))

    def log_text(self) -> str:
        p = self.home / "logs" / "memoriesd.log"
        return p.read_text("utf-8", "replace") if p.exists() else ""

    def hwm_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon so far, all threads (``/proc/PID/stat``)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def call(self, method: str, params: dict[str, Any]) -> Any:
        return self.conn.call(method, params)

    def timed(self, method: str, params: dict[str, Any]) -> tuple[float, Any]:
        """Wall seconds of one request (``self.last_cpu``: the daemon's CPU seconds meanwhile)."""
        c0 = self.cpu_seconds()
        t0 = time.perf_counter()
        out = self.conn.call(method, params)
        wall = time.perf_counter() - t0
        self.last_cpu = self.cpu_seconds() - c0
        return wall, out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def _search(d: Daemon, mode: str) -> tuple[float, Any]:
    return d.timed("rag.search", {"vault": d.vid, "query": FIRST_QUERY, "mode": mode, "limit": 10})


def _cycle(d: Daemon) -> dict[str, Any]:
    """Unlock -> first BM25 search; lock; unlock -> first vector search; lock."""
    out: dict[str, Any] = {}
    before = len(_RESTORED.findall(d.log_text()))
    unlock_s, _ = d.timed("vault.unlock", {"vault": d.vid, "passphrase": PASSPHRASE})
    unlock_cpu = d.last_cpu
    bm25_s, r = _search(d, "bm25")
    assert r["results"], "no BM25 result"
    out.update({"unlock_seconds": round(unlock_s, 3), "first_bm25_seconds": round(bm25_s, 3),
                "unlock_to_first_bm25_seconds": round(unlock_s + bm25_s, 3),
                "unlock_cpu_seconds": round(unlock_cpu, 2), "first_bm25_cpu_seconds": round(d.last_cpu, 2),
                "unlock_to_first_bm25_cpu_seconds": round(unlock_cpu + d.last_cpu, 2)})
    d.call("vault.lock", {"vault": d.vid})
    unlock2_s, _ = d.timed("vault.unlock", {"vault": d.vid, "passphrase": PASSPHRASE})
    unlock2_cpu = d.last_cpu
    vec_s, r = _search(d, "vector")
    assert r["results"] and not r["missing_vectors"], "the vector search did not find its vectors"
    q_ms = float(r["timings_ms"].get("query_embed_ms", 0.0))
    loads = _LOADED.findall(d.log_text())
    out.update({
        "unlock2_seconds": round(unlock2_s, 3),
        "first_vector_seconds": round(vec_s, 3),
        "query_embed_ms": round(q_ms, 1),
        "first_vector_excl_query_seconds": round(vec_s - q_ms / 1000, 3),
        "unlock_to_first_vector_excl_query_seconds": round(unlock2_s + vec_s - q_ms / 1000, 3),
        "first_vector_cpu_seconds": round(d.last_cpu, 2),
        "unlock_to_first_vector_cpu_seconds": round(unlock2_cpu + d.last_cpu, 2),
        "sealed_vectors_load_seconds": float(loads[-1][1]) if loads else None,
        "snapshot_restores": len(_RESTORED.findall(d.log_text())) - before,
    })
    d.call("vault.lock", {"vault": d.vid})
    return out


def _wait_for(pred: Callable[[], bool], what: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def _build(home: Path, svc: EmbeddingService, docs: list[dict[str, Any]], size: int, log: Callable[[str], None]) -> dict[str, Any]:
    home.mkdir(parents=True, mode=0o700)
    (home / "config.toml").write_text(_config(svc))
    d = Daemon(REPO, home)
    try:
        d.vid = d.call("vault.create", {"name": "bench", "passphrase": PASSPHRASE})["vault_id"]
        files, nbytes, _ = write_notes(home.parent / "notes", docs, size)
        log(f"first_result {size}: ingesting {files} files ({nbytes / 1e6:.1f} MB), embedding through {svc.url}")
        d.call("rag.ingest", {"vault": d.vid, "paths": [str(home.parent / "notes")], "recursive": True})
        _search(d, "bm25")
        t0 = time.perf_counter()
        while d.call("rag.index", {"vault": d.vid})["remaining"]:
            pass
        embed_s = time.perf_counter() - t0
        snap = home / "vaults" / d.vid / "lexical-index.bin"
        _wait_for(lambda: snap.exists() and "lexical snapshot written" in d.log_text(), "the lexical snapshot")
        st = d.call("rag.status", {"vault": d.vid})
        d.call("vault.lock", {"vault": d.vid})
        sidecars = list((home / "vaults" / d.vid).glob("vectors-*.bin"))
        return {"files": files, "mb": round(nbytes / 1e6, 2), "fragments": st["fragments"],
                "embed_seconds_via_service": round(embed_s, 1),
                "sealed_sidecar_mib": round(sum(p.stat().st_size for p in sidecars) / 2**20, 1)}
    finally:
        d.close()


def _prepare_baseline(tree: Path, home: Path, log: Callable[[str], None]) -> Daemon:
    """A daemon of ``tree`` on ``home`` whose lexical snapshot is in that tree's own format."""
    d = Daemon(tree, home)
    marks = d.log_text().count("lexical snapshot written")
    restores = len(_RESTORED.findall(d.log_text()))
    d.call("vault.unlock", {"vault": d.vid, "passphrase": PASSPHRASE})
    _search(d, "bm25")
    if len(_RESTORED.findall(d.log_text())) == restores:  # that tree's snapshot format differs: it writes its own
        log("first_result: baseline tree writes its own lexical snapshot")
        _wait_for(lambda: d.log_text().count("lexical snapshot written") > marks, "the baseline's lexical snapshot")
    d.call("vault.lock", {"vault": d.vid})
    return d


def _as_version_1(home: Path) -> bool:
    """Rewrite the (locked) vault's vector sidecar as a version-1 file (float32 rows), as a tree from
    before version-2 sidecars wrote it. False when the vault has no version-2 sidecar."""
    from memoriesd.index.vectors.names import read_spaces, sidecar_opaque_id
    from memoriesd.index.vectors.sidecar import MAGIC, VectorStore
    from memoriesd.vault import crypto
    from memoriesd.vault.store import VaultStore

    [vdir] = [p for p in (home / "vaults").iterdir() if p.is_dir()]
    sidecars = [p for p in vdir.glob("vectors-*.bin") if p.read_bytes()[:8] == MAGIC]
    if not sidecars:
        return False
    store = VaultStore.open(vdir, passphrase=PASSPHRASE.encode())
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        spaces = read_spaces(vdir, vault_id=store.vault_id, open_=sealer.open)
        for path in sidecars:
            entry = spaces[sidecar_opaque_id(path)]
            side = VectorStore(path, vault_id=store.vault_id, identity=str(entry["identity"]),
                               dims=int(str(entry["dims"])), seal=sealer.seal, open_=sealer.open)
            side._rewrite(side.load(), "float32", version=1)
    finally:
        sealer.wipe()
        store.close()
    return True


def _disk(home: Path, fragments: int) -> dict[str, float]:
    """Sealed bytes on disk per fragment: the vector sidecar(s) and the whole vault directory."""
    [vdir] = [p for p in (home / "vaults").iterdir() if p.is_dir()]
    side = sum(p.stat().st_size for p in vdir.glob("vectors-*.bin"))
    total = sum(p.stat().st_size for p in vdir.iterdir() if p.is_file())
    return {"vector_sidecar": round(side / fragments, 1), "vault_dir": round(total / fragments, 1),
            "vector_sidecar_mib": round(side / 2**20, 1)}


def _upgrade(home: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """This tree's daemon on a vault with a version-1 sidecar: the first vector result after unlock
    (which also rewrites the sidecar as version 2), then the next unlock's."""
    (home / "run" / "memoriesd.sock").unlink(missing_ok=True)
    d = Daemon(REPO, home)
    try:
        log("first_result: upgrade of a version-1 sidecar by this tree")
        out: dict[str, Any] = {}
        for label in ("first_unlock", "next_unlock"):
            d.call("vault.unlock", {"vault": d.vid, "passphrase": PASSPHRASE})
            s, r = _search(d, "vector")
            assert r["results"] and not r["missing_vectors"], "the upgraded sidecar lost vectors"
            out[f"{label}_first_vector_seconds"] = round(s, 3)
            out[f"{label}_first_vector_cpu_seconds"] = round(d.last_cpu, 2)
            d.call("vault.lock", {"vault": d.vid})
        out["rss_peak_mib"] = d.hwm_mib()
        out["rewritten"] = "rewritten in int8" in d.log_text()
        return out
    finally:
        d.close()


def first_result_bench(
    size: int, docs: list[dict[str, Any]], *, repeats: int, baseline_tree: Path | None, log: Callable[[str], None]
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mbr", dir="/tmp"))
    svc = EmbeddingService(DIMS)
    daemons: dict[str, Daemon] = {}
    out: dict[str, Any] = {"requested_fragments": size, "vectors": f"{DIMS}-dim bag-of-words from tests/embed_server.py on 127.0.0.1"}
    try:
        out.update(_build(work / "h", svc, docs, size, log))
        homes = {"current": work / "h", "whole_file_vectors": work / "h-whole"}
        shutil.copytree(work / "h", homes["whole_file_vectors"], symlinks=True)
        base_v1 = False
        if baseline_tree is not None:
            homes["baseline"] = work / "h-base"
            shutil.copytree(work / "h", homes["baseline"], symlinks=True)
            if not (baseline_tree / "memoriesd" / "index" / "vector_chunks.py").exists():
                base_v1 = _as_version_1(homes["baseline"])  # what that tree writes and reads
        for home in homes.values():
            (home / "run" / "memoriesd.sock").unlink(missing_ok=True)
        daemons["current"] = Daemon(REPO, homes["current"])
        daemons["whole_file_vectors"] = Daemon(REPO, homes["whole_file_vectors"], {"MEMORIES_BENCH_WHOLE_FILE_VECTORS": "1"})
        if baseline_tree is not None:
            daemons["baseline"] = _prepare_baseline(baseline_tree, homes["baseline"], log)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in daemons}
        hwm: dict[str, float] = {}
        for r in range(repeats):
            for name, d in daemons.items():
                log(f"first_result {size}: cycle {r + 1}/{repeats} {name}")
                runs[name].append(_cycle(d))
                if r == 0:
                    hwm[name] = d.hwm_mib()  # fresh daemon: its peak after one unlock + restore + vector load
        for name, rs in runs.items():
            keys = [k for k in rs[0] if isinstance(rs[0][k], (int, float)) and rs[0][k] is not None]
            out[name] = {k: round(statistics.median(x[k] for x in rs), 3) for k in keys}
            out[name]["rss_peak_after_first_cycle_mib"] = hwm[name]
            out[name]["runs"] = rs
        out["sealed_bytes_per_fragment"] = _disk(homes["current"], out["fragments"])
        if baseline_tree is not None:
            out["baseline_sealed_bytes_per_fragment"] = _disk(homes["baseline"], out["fragments"])
            if base_v1:
                daemons.pop("baseline").close()
                out["upgrade"] = _upgrade(homes["baseline"], log)
        cur = out["current"]
        for other in ("whole_file_vectors", "baseline"):
            if other in out:
                o = out[other]
                out[f"{other}_over_current"] = {
                    k: round(o[k] / cur[k], 2)
                    for k in ("unlock_seconds", "unlock_to_first_bm25_seconds", "first_vector_excl_query_seconds",
                              "unlock_to_first_vector_excl_query_seconds", "unlock_cpu_seconds",
                              "unlock_to_first_bm25_cpu_seconds", "first_vector_cpu_seconds",
                              "rss_peak_after_first_cycle_mib")
                    if cur.get(k)
                }
    finally:
        for d in daemons.values():
            d.close()
        svc.close()
        shutil.rmtree(work, ignore_errors=True)
    return out
