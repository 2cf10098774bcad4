"""Adversarial checks of memoriesd: reproduce the defects reported in issue 13 against a real daemon.

Each scenario starts its own ``memoriesd`` process on a throw-away home under /tmp (a short path:
AF_UNIX socket paths are limited to 107 bytes), attacks it as a hostile or unlucky client would
(raw socket protocol for concurrency, the real ``memories`` CLI in a subprocess where the scenario
is about the CLI) and says whether the defect is present. Every scenario has a hard timeout: when it
hangs, its daemon and CLI processes are killed and it is reported as a finding.

Output: one JSON document on stdout::

    {"scenarios": {NAME: {"ok": bool, "detail": str, "seconds": float}}, "found": N}

``ok`` means the defect is NOT present; ``found`` counts the scenarios that are not ok. The exit
status is 1 when anything was found, else 0. Progress lines go to stderr.

Run it from the repository root with the project's virtual environment::

    .venv/bin/python -m bench.attack_daemon                      # every scenario
    .venv/bin/python -m bench.attack_daemon --only deep_json,fifo    # some (--only is repeatable)
    .venv/bin/python -m bench.attack_daemon --list                   # their names
    .venv/bin/python -m bench.attack_daemon --keep --only rollback_head   # keep the homes to inspect

A clean run takes about 1.5 minutes; a daemon or CLI that hangs costs up to its scenario's timeout
(60 s for the CLI hangs), so a run that finds every defect stays under about 5 minutes.

``zero_key_vectors`` needs the small real model at ../shared/models/all-MiniLM-L6-v2-onnx (or
``--model-dir``); it is skipped, as ok, when the model is missing. Only the standard library and
the project's own dependencies are used; the daemon under test is the working tree's
(``python -m memoriesd.main`` run from the repository root).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import os
import random
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MINILM = REPO.parent / "shared" / "models" / "all-MiniLM-L6-v2-onnx"
OPTIONS: dict[str, Any] = {"model_dir": MINILM, "keep": False}  # --model-dir, --keep
PYTHON = sys.executable

CHEAP_KDF = """
[vault]
kdf_memory_kib = 64
kdf_iterations = 1
kdf_lanes = 1
"""
# A CLI never starts a daemon of its own here: every daemon is one this script started and will stop.
NO_AUTOSTART = """
[daemon]
autostart = false
"""

HEADER = struct.Struct(">I")
PASS = "correct horse battery"


# ---------------------------------------------------------------------------------------------- plumbing


class DaemonError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(data)) + data


def raw_frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return json.loads(_recv_exact(sock, n).decode("utf-8"))


def recv_reply(sock: socket.socket) -> dict[str, Any]:
    """The next response frame (progress frames skipped)."""
    while True:
        msg = recv_frame(sock)
        if "progress" not in msg:
            return msg


class Daemon:
    """A real memoriesd process on a home this script owns."""

    def __init__(self, home: Path, *, preexec_fn: Callable[[], None] | None = None) -> None:
        self.home = home
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = home.parent / f"daemon-{time.monotonic_ns()}.stderr"

    @property
    def socket_path(self) -> Path:
        return self.home / "run" / "memoriesd.sock"

    @property
    def log_path(self) -> Path:
        return self.home / "logs" / "memoriesd.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> Daemon:
        env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "memoriesd.main", "--home", str(self.home)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=str(REPO),
                env=env,
                preexec_fn=self.preexec_fn,  # only a setrlimit (idle_connections)
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memoriesd exited at start: {self.stderr_path.read_text('utf-8', 'replace')[-500:]}")
            if self.socket_path.exists():
                try:
                    self.call("daemon.status", timeout=5)
                    return self
                except (OSError, DaemonError):
                    pass
            time.sleep(0.05)
        raise RuntimeError("memoriesd did not answer within its start timeout")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self, timeout: float | None = 30.0) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(self.socket_path))
        except OSError:
            s.close()
            raise
        return s

    def request(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 60.0,
                sock: socket.socket | None = None, rid: int = 1) -> dict[str, Any]:
        own = sock is None
        s = sock or self.connect(timeout)
        try:
            s.sendall(frame({"id": rid, "method": method, "params": params or {}}))
            return recv_reply(s)
        finally:
            if own:
                s.close()

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 60.0) -> Any:
        msg = self.request(method, params, timeout=timeout)
        if "error" in msg:
            err = msg["error"] or {}
            raise DaemonError(str(err.get("code")), str(err.get("message")))
        return msg["result"]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``. Returns the exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""


class CliResult:
    def __init__(self, rc: int | None, out: bytes, err: bytes, seconds: float) -> None:
        self.rc = rc  # None: it did not end within its timeout and was killed
        self.out = out
        self.err = err
        self.seconds = seconds

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.decode("utf-8", "replace").splitlines() if ln.strip()]

    def brief(self) -> str:
        err = " | ".join(self.err_lines)[:300]
        return f"exit {self.rc} after {self.seconds:.1f} s, stderr: {err!r}"


class Scenario:
    """What one scenario owns: homes, daemons and CLI processes, all cleaned up (or killed) at its end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.roots: list[Path] = []
        self.daemons: list[Daemon] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()

    def home(self, config: str = CHEAP_KDF) -> Path:
        root = Path(tempfile.mkdtemp(prefix="atk", dir="/tmp"))
        self.roots.append(root)
        home = root / "h"
        home.mkdir(mode=0o700)
        (home / "config.toml").write_text(NO_AUTOSTART + config)
        return home

    def daemon(self, home: Path, **kw: Any) -> Daemon:
        d = Daemon(home, **kw)
        with self.lock:
            self.daemons.append(d)
        return d.start()

    def cli(self, home: Path, *args: str | bytes, stdin: bytes = b"", timeout: float = 60.0,
            env: dict[str, str] | None = None) -> CliResult:
        """The real `memories` CLI; killed (rc None) when it does not end within ``timeout``."""
        full_env = dict(os.environ, **(env or {}))
        for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "MEMORIES_HOME"):
            full_env.pop(var, None)
        full_env.setdefault("COLUMNS", "200")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [PYTHON, "-m", "memories_cli.main", "--home", str(home), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=str(REPO), env=full_env, start_new_session=True,
        )
        with self.lock:
            self.procs.append(proc)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            return CliResult(proc.returncode, out, err, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return CliResult(None, out, err, time.monotonic() - t0)

    def kill_all(self) -> None:
        with self.lock:
            daemons, procs = list(self.daemons), list(self.procs)
        for p in procs:
            _kill_group(p)
        for d in daemons:
            d.kill()

    def cleanup(self) -> None:
        with self.lock:
            daemons = list(self.daemons)
        for d in daemons:
            d.stop(10)
        self.kill_all()
        for root in self.roots:
            if OPTIONS["keep"]:
                print(f"[attack] {self.name}: kept {root}", file=sys.stderr, flush=True)
            else:
                shutil.rmtree(root, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def create_vault(d: Daemon, name: str = "v", passphrase: str = PASS) -> str:
    return str(d.call("vault.create", {"name": name, "passphrase": passphrase})["vault_id"])


def code_of(msg: dict[str, Any]) -> str | None:
    """The error code of a response, None for a result."""
    return str((msg.get("error") or {}).get("code")) if "error" in msg else None


def write_docs(folder: Path, n: int, prefix: str = "doc", words: str = "alpha beta gamma") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"{prefix}{i:04d}.md").write_text(
            f"# {prefix} number {i}\n\n{words} paragraph {i} about topic {i % 7} and item {i * 13 % 101}.\n"
        )


Result = tuple[bool, str]


# ---------------------------------------------------------------------------------------------- scenarios


def passwd_vs_write(sc: Scenario) -> Result:
    """Writers add records while vault.passwd runs again and again (and compactions run between)."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d, passphrase="p0")
    acked: list[str] = []
    errors: Counter[str] = Counter()
    stop = threading.Event()
    lock = threading.Lock()

    def writer(w: int) -> None:
        n = 0
        try:
            with d.connect(60) as s:
                while not stop.is_set():
                    msg = d.request("memory.add", {"vault": vid, "title": f"w{w}-{n}", "body": f"writer {w} record {n}"},
                                    sock=s, rid=n)
                    with lock:
                        if "error" in msg:
                            errors[code_of(msg) or "?"] += 1
                        else:
                            acked.append(msg["result"]["id"])
                    n += 1
        except (OSError, ConnectionError) as exc:
            with lock:
                errors[f"connection:{type(exc).__name__}"] += 1

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    current, changes, compactions, admin_errors = "p0", 0, 0, Counter()
    t_end = time.monotonic() + 6.0
    while time.monotonic() < t_end:
        new = f"p{changes + 1}"
        msg = d.request("vault.passwd", {"vault": vid, "old": current, "new": new})
        if "error" in msg:
            admin_errors[f"passwd:{code_of(msg)}"] += 1
        else:
            current, changes = new, changes + 1
        if changes % 4 == 2:
            msg = d.request("vault.compact", {"vault": vid})
            if "error" in msg:
                admin_errors[f"compact:{code_of(msg)}"] += 1
            else:
                compactions += 1
    stop.set()
    for t in threads:
        t.join(30)
    d.call("vault.lock", {"vault": vid})
    problems = []
    for attempt in ("lock/unlock", "restart"):
        if attempt == "restart":
            d.call("vault.lock", {"vault": vid})
            d.stop()
            d = sc.daemon(home)
        msg = d.request("vault.unlock", {"vault": vid, "passphrase": current})
        if "error" in msg:
            problems.append(f"{attempt}: unlock with the final passphrase failed: {msg['error']}")
            break
        present = {r["id"] for r in d.call("memory.list", {"vault": vid})["records"]}
        missing = [r for r in acked if r not in present]
        if missing:
            problems.append(f"{attempt}: {len(missing)} of {len(acked)} acknowledged records missing")
    bad_codes = {k: v for k, v in errors.items() if k in ("internal", "vault_corrupt") or k.startswith("connection:")}
    if bad_codes:
        problems.append(f"writers got {bad_codes}")
    if any(k.endswith((":internal", ":vault_corrupt")) for k in admin_errors):
        problems.append(f"passwd/compact got {dict(admin_errors)}")
    summary = (f"{len(acked)} records acknowledged, {changes} passphrase changes, {compactions} compactions, "
               f"writer errors {dict(errors)}, admin errors {dict(admin_errors)}")
    return (not problems, "; ".join(problems + [summary]))


def lock_vs_search(sc: Scenario) -> Result:
    """bm25 searches in several threads while the vault is locked and unlocked in a loop."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    for i in range(60):
        d.call("memory.add", {"vault": vid, "title": f"note {i}", "body": f"alpha beta {i} gamma delta {i % 5}"})
    codes: Counter[str] = Counter()
    late_successes: list[float] = []
    lock_done = [float("inf")]
    stop = threading.Event()
    lock = threading.Lock()

    def searcher(n: int) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                msg = d.request("rag.search", {"vault": vid, "query": "alpha gamma", "mode": "bm25"}, timeout=30)
            except (OSError, ConnectionError, ValueError) as exc:
                with lock:
                    codes[f"connection:{type(exc).__name__}"] += 1
                continue
            with lock:
                code = code_of(msg)
                codes[code or "ok"] += 1
                if code is None and sent > lock_done[0]:
                    late_successes.append(sent - lock_done[0])

    threads = [threading.Thread(target=searcher, args=(n,), daemon=True) for n in range(5)]
    for t in threads:
        t.start()
    cycles = 0
    t_end = time.monotonic() + 6.0
    while time.monotonic() < t_end:
        d.call("vault.lock", {"vault": vid})
        time.sleep(0.01)
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        time.sleep(0.03)
        cycles += 1
    d.call("vault.lock", {"vault": vid})
    with lock:
        lock_done[0] = time.monotonic()
    time.sleep(1.5)  # searches keep coming after the final lock
    stop.set()
    for t in threads:
        t.join(30)
    after = [code_of(d.request("rag.search", {"vault": vid, "query": "alpha", "mode": "bm25"})) for _ in range(10)]
    problems = []
    if codes.get("internal"):
        problems.append(f"{codes['internal']} searches answered internal")
    conn = {k: v for k, v in codes.items() if k.startswith("connection:")}
    if conn:
        problems.append(f"connections failed: {conn}")
    if late_successes or any(c is None for c in after):
        problems.append(f"searches succeeded after the final lock ({len(late_successes)} in threads, "
                        f"{sum(c is None for c in after)} of 10 after)")
    if not d.alive():
        problems.append("the daemon died")
    return (not problems, "; ".join(problems + [f"{cycles} lock/unlock cycles, answers {dict(codes)}"]))


def zero_key_vectors(sc: Scenario) -> Result:
    """Index A while searches of B evict A's index (max_vaults = 1), and lock A during rag.index; then
    no vector sidecar of A may hold an entry that opens with an all-zero key."""
    model_dir = Path(OPTIONS["model_dir"])
    if not (model_dir / "model.onnx").is_file():
        return True, f"skipped: no model at {model_dir}"

    def config(background: bool) -> str:
        return CHEAP_KDF + f"""
[rag]
local_model_dir = "{model_dir}"
local_threads = 2
background_index = {"true" if background else "false"}
[rag.cache]
max_vaults = 1
"""

    home = sc.home(config(False))
    docs = home.parent / "docs"
    d = sc.daemon(home)
    a = create_vault(d, "a")
    b = create_vault(d, "b")
    vault_dir = home / "vaults" / a
    write_docs(docs / "a1", 240, "a1-")
    write_docs(docs / "b", 20, "b-", words="delta epsilon")
    d.call("rag.ingest", {"vault": a, "paths": [str(docs / "a1")], "recursive": True}, timeout=120)
    d.call("rag.ingest", {"vault": b, "paths": [str(docs / "b")], "recursive": True}, timeout=120)
    notes: list[str] = []
    answers: Counter[str] = Counter()
    answers_lock = threading.Lock()
    # A later append under the right key truncates an uncommitted tail and overwrites a commit slot, so
    # the sidecars are copied as they change (every search round), not only checked at the end.
    snapshots: dict[bytes, tuple[str, bytes]] = {}

    def snapshot() -> None:
        for path in sorted(vault_dir.glob("vector*.bin")):
            with contextlib.suppress(OSError):
                data = path.read_bytes()
                snapshots.setdefault(hashlib.sha256(data).digest(), (path.name, data))

    def evict_while(busy: threading.Thread) -> int:
        n = 0
        while busy.is_alive():
            for vault in (b, a):  # B's search evicts A's index; A's search brings it back
                time.sleep(random.uniform(0, 0.04))  # land in every part of an embedding batch
                msg = d.request("rag.search", {"vault": vault, "query": "delta alpha", "mode": "bm25"}, timeout=60)
                with answers_lock:
                    answers[f"search:{code_of(msg) or 'ok'}"] += 1
            snapshot()
            n += 1
        return n

    def index_a(out: list[Any], started: threading.Event) -> None:
        """rag.index of A; ``started`` is set at its first progress frame (a batch is sealed)."""
        try:
            with d.connect(120) as s:
                s.sendall(frame({"id": 1, "method": "rag.index", "params": {"vault": a}}))
                while True:
                    msg = recv_frame(s)
                    if "progress" not in msg:
                        break
                    started.set()
        except (OSError, ConnectionError) as exc:
            msg = {"error": {"code": f"connection:{type(exc).__name__}", "message": str(exc)}}
        started.set()
        with answers_lock:
            answers[f"index:{code_of(msg) or 'ok'}"] += 1
        out.append(msg)

    def run_index(evict: bool, lock_after: float | None = None) -> Any:
        res: list[Any] = []
        started = threading.Event()
        t = threading.Thread(target=index_a, args=(res, started), daemon=True)
        t.start()
        started.wait(30)  # evict once the pass has sealed a batch: the next batch is in flight
        if evict:
            evict_while(t)
        if lock_after is not None:
            time.sleep(lock_after)
            d.call("vault.lock", {"vault": a}, timeout=90)
        t.join(120)
        snapshot()
        return res[0] if res else None

    def identity_of(msg: Any) -> set[str]:
        return {str(msg["result"].get("model"))} if msg and "result" in msg else set()

    # Run 1 (foreground rag.index): evictions of A's index under the pass, pass after pass (a pass the
    # eviction broke leaves fragments for the next one).
    identities: set[str] = set()
    shown = []
    for _ in range(5):
        msg = run_index(evict=True)
        shown.append(_short(msg))
        identities |= identity_of(msg)
        if msg and "result" in msg and not msg["result"].get("remaining"):
            break
    notes.append(f"index under eviction: {', '.join(shown)}")
    identities.add(str(d.call("rag.status", {"vault": a})["embedding"].get("model")))

    # Run 2: lock A during rag.index.
    write_docs(docs / "a2", 240, "a2-")
    d.call("rag.ingest", {"vault": a, "paths": [str(docs / "a2")], "recursive": True}, timeout=120)
    notes.append(f"lock during index: {_short(run_index(evict=False, lock_after=0.05))}")

    # Run 3 (background indexer on): evictions and a lock while the background job embeds A.
    d.stop()
    (home / "config.toml").write_text(NO_AUTOSTART + config(True))
    d = sc.daemon(home)
    for vault in (a, b):
        d.call("vault.unlock", {"vault": vault, "passphrase": PASS})
    write_docs(docs / "a3", 160, "a3-")
    d.call("rag.ingest", {"vault": a, "paths": [str(docs / "a3")], "recursive": True}, timeout=120)
    t = threading.Thread(target=time.sleep, args=(2.0,), daemon=True)
    t.start()
    evict_while(t)
    d.call("vault.lock", {"vault": a}, timeout=90)
    snapshot()
    d.call("vault.unlock", {"vault": a, "passphrase": PASS})
    msg = run_index(evict=True)
    notes.append(f"background: {_short(msg)}")
    identities |= identity_of(msg)
    identities.add(str(d.call("rag.status", {"vault": a})["embedding"].get("model")))
    d.call("vault.lock", {"all": True}, timeout=90)
    d.stop()
    snapshot()

    findings, summary = _check_vector_snapshots(vault_dir, a, identities, list(snapshots.values()))
    if answers["search:internal"] or answers["index:internal"]:
        findings.append(f"rag.search/rag.index answered internal: {dict(answers)}")
    summary += f"; answers {dict(answers)}; " + "; ".join(notes)
    if findings:
        return False, "; ".join(findings) + "; " + summary
    return True, summary


def _check_vector_snapshots(vault_dir: Path, vault_id: str, identities: set[str],
                            snapshots: list[tuple[str, bytes]]) -> tuple[list[str], str]:
    """Open every snapshot of A's vector files with the real key and with all-zero keys, as a whole
    (VectorStore.peek_keys on a copy: load would discard a file it cannot open) and entry by entry (a
    batch sealed under a wiped key after batches under the real key leaves a file no key opens whole)."""
    import logging

    from memoriesd.index.vectors.names import SPACES_NAME, read_spaces
    from memoriesd.index.vectors.sidecar import VectorStore
    from memoriesd.vault import crypto
    from memoriesd.vault.format import read_header
    from memoriesd.vault.store import unwrap_key

    logging.getLogger("memoriesd").setLevel(logging.CRITICAL)  # opening a foreign file warns

    class ZeroSubkey:
        """A sealer whose subkey itself is all zeros (a Sealer after wipe())."""

        def seal(self, plaintext: bytes, aad: bytes) -> bytes:
            return crypto.seal(bytes(32), plaintext, aad)

        def open(self, blob: bytes, aad: bytes) -> bytes:
            return crypto.open_sealed(bytes(32), blob, aad)

    key = unwrap_key(read_header(vault_dir, "a"), PASS.encode())
    sealers: dict[str, Any] = {
        "real key": crypto.Sealer(key, crypto.LABEL_VECTORS),
        "HKDF(zero vault key)": crypto.Sealer(bytes(32), crypto.LABEL_VECTORS),
        "zero subkey": ZeroSubkey(),
    }
    crypto.wipe(key)
    spaces: dict[str, dict[str, object]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="atkv", dir=str(vault_dir.parents[2])))
    for name, data in snapshots:
        if name == SPACES_NAME:
            (scratch / SPACES_NAME).write_bytes(data)
            spaces.update(read_spaces(scratch, vault_id=vault_id, open_=sealers["real key"].open))
    identities = ({i for i in identities if i != "None"} | {str(e["identity"]) for e in spaces.values()})
    dims = {384} | {int(str(e["dims"])) for e in spaces.values()}
    opened: Counter[str] = Counter()
    findings: set[str] = set()
    zero_entries: dict[tuple[str, str], set[tuple[str, int]]] = {}  # (file, key) -> {(slot|chunk, number)}
    sidecar_snaps = [(n, data) for n, data in snapshots if n.startswith("vectors-")]
    for name, data in snapshots:
        if name != SPACES_NAME:
            continue
        (scratch / SPACES_NAME).write_bytes(data)
        for label, sealer in sealers.items():
            if label != "real key" and read_spaces(scratch, vault_id=vault_id, open_=sealer.open):
                findings.add(f"{SPACES_NAME} opens with the {label}")
    for name, data in sidecar_snaps:
        entries = _sidecar_entries(data)
        copy = scratch / name
        for identity in sorted(identities):
            for dim in sorted(dims):
                for label, sealer in sealers.items():
                    copy.write_bytes(data)
                    store = VectorStore(copy, vault_id=vault_id, identity=identity, dims=dim,
                                        seal=sealer.seal, open_=sealer.open)
                    if store.peek_keys() is not None:
                        opened[f"{label}: whole file"] += 1
                        if label != "real key":
                            findings.add(f"{name} opens whole with the {label}")
                    for kind, number, blob in entries:
                        aad = store._slot_aad(number) if kind == "slot" else store._chunk_aad(number)
                        if _opens(sealer, blob, aad):
                            opened[f"{label}: entry"] += 1
                            if label != "real key":
                                zero_entries.setdefault((name, label), set()).add((kind, number))
    for (name, label), where in sorted(zero_entries.items()):
        kinds = Counter(kind for kind, _ in where)
        findings.add(f"{name}: {kinds['chunk']} chunk(s) and {kinds['slot']} commit slot(s) open with the {label}")
    summary = (f"{len(sidecar_snaps)} distinct snapshots of A's sidecars checked, opened: {dict(opened)}, "
               f"identities {sorted(i[:24] for i in identities)}")
    if not opened["real key: whole file"] and not findings:
        findings.add("inconclusive: no sidecar of A opened with the real key, so the check proved nothing")
    return sorted(findings), summary


def _sidecar_entries(data: bytes) -> list[tuple[str, int, bytes]]:
    """The sealed pieces of a vector sidecar: ("slot", 0|1, blob) and ("chunk", i, blob) in file order
    (format in memoriesd/index/vectors/sidecar.py: MAGIC | 2 commit slots | {u32 length | chunk}*)."""
    from memoriesd.index.vectors.sidecar import HEADER_SIZE, MAGIC, SLOT_SIZE

    out: list[tuple[str, int, bytes]] = []
    if data[: len(MAGIC)] != MAGIC or len(data) < HEADER_SIZE:
        return out
    for slot in (0, 1):
        start = len(MAGIC) + slot * SLOT_SIZE
        (n,) = struct.unpack_from(">H", data, start)
        if 0 < n <= SLOT_SIZE - 2:
            out.append(("slot", slot, data[start + 2 : start + 2 + n]))
    pos, number = HEADER_SIZE, 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        blob = data[pos + 4 : pos + 4 + n]
        if len(blob) != n:
            break
        out.append(("chunk", number, blob))
        pos += 4 + n
        number += 1
    return out


def _opens(sealer: Any, blob: bytes, aad: bytes) -> bool:
    try:
        sealer.open(blob, aad)
    except Exception:  # any failure to open is "does not open"
        return False
    return True


def _secs(value: Any) -> str:
    return f"answered in {value:.2f} s" if isinstance(value, float) else repr(value)


def _short(msg: Any) -> str:
    if msg is None:
        return "none (no answer)"
    if "error" in msg:
        return f"error {code_of(msg)}"
    r = msg["result"]
    return f"embedded {r.get('embedded')}, remaining {r.get('remaining')}"


def rollback_head(sc: Scenario) -> Result:
    """Restore an older head.bin after 5 more acknowledged records: refused, or all 10 records kept."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    vdir = home / "vaults" / vid
    for i in range(5):
        d.call("memory.add", {"vault": vid, "title": f"r{i}", "body": f"record {i}"})
    old_head = (vdir / "head.bin").read_bytes()
    for i in range(5, 10):
        d.call("memory.add", {"vault": vid, "title": f"r{i}", "body": f"record {i}"})
    d.call("vault.lock", {"vault": vid})
    d.stop()

    def log_bytes() -> int:
        return sum(p.stat().st_size for p in vdir.glob("log-*.bin"))

    before = log_bytes()
    (vdir / "head.bin").write_bytes(old_head)
    d = sc.daemon(home)
    msg = d.request("vault.unlock", {"vault": vid, "passphrase": PASS})
    after = log_bytes()
    shrunk = f"; the log shrank from {before} to {after} bytes" if after < before else ""
    if "error" in msg:
        err = msg["error"]
        clear = bool(err.get("message")) and err.get("code") not in ("internal",)
        return clear and not shrunk, f"unlock refused: {err.get('code')}: {err.get('message')}{shrunk}"
    n = len(d.call("memory.list", {"vault": vid})["records"])
    ok = n == 10 and not shrunk
    return ok, f"unlock accepted the old head: {n} of 10 records present{shrunk}"


def concurrent_unlock_default_kdf(sc: Scenario) -> Result:
    """Default (strong) KDF, two vaults, six parallel unlocks (some wrong); then SIGTERM."""
    home = sc.home("")  # no [vault] section: the default Argon2id parameters
    d = sc.daemon(home)
    a = create_vault(d, "a", "pass-a")
    b = create_vault(d, "b", "pass-b")
    d.call("vault.lock", {"all": True})
    attempts = [(a, "pass-a"), (a, "wrong-a"), (b, "wrong-b"), (b, "pass-b"), (a, "wrong-a2"), (b, "pass-b")]
    answers: dict[int, Any] = {}
    t0 = time.monotonic()

    def unlock(i: int, vault: str, pw: str) -> None:
        try:
            answers[i] = (d.request("vault.unlock", {"vault": vault, "passphrase": pw}, timeout=60), time.monotonic() - t0)
        except (OSError, ConnectionError) as exc:
            answers[i] = (exc, time.monotonic() - t0)

    threads = [threading.Thread(target=unlock, args=(i, v, p), daemon=True) for i, (v, p) in enumerate(attempts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, 60 - (time.monotonic() - t0)))
    problems = []
    shown = []
    for i, (_vault, pw) in enumerate(attempts):
        if i not in answers:
            problems.append(f"unlock {i} did not answer within 60 s")
            continue
        msg, secs = answers[i]
        if isinstance(msg, Exception):
            problems.append(f"unlock {i} failed on the connection: {msg!r}")
            continue
        code = code_of(msg)
        shown.append(f"{'right' if pw.startswith('pass') else 'wrong'}->{code or 'ok'} {secs:.1f}s")
        want = None if pw.startswith("pass") else "bad_passphrase"
        if code != want:
            problems.append(f"unlock {i} ({'right' if want is None else 'wrong'} passphrase) answered {code or 'ok'}")
    t1 = time.monotonic()
    rc = d.stop(timeout=20)
    if rc is None:
        problems.append("SIGTERM did not stop the daemon within 20 s (killed)")
    elif rc != 0:
        problems.append(f"the daemon exited with status {rc} on SIGTERM")
    return (not problems, "; ".join(problems + [", ".join(shown), f"SIGTERM -> exit {rc} in {time.monotonic() - t1:.1f} s"]))


def idle_connections(sc: Scenario) -> Result:
    """1,100 idle connections against a daemon with 1,024 file descriptors, then the CLI."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    def limit_fds() -> None:
        h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, h))

    home = sc.home()
    d = sc.daemon(home, preexec_fn=limit_fds)
    conns: list[socket.socket] = []
    refused = ""
    try:
        while len(conns) < 1100 and not refused:
            # A full accept backlog answers EAGAIN at once: retry for a while, as a patient client would.
            deadline = time.monotonic() + 3.0
            while True:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(2.0)
                try:
                    s.connect(str(d.socket_path))
                    conns.append(s)
                    break
                except OSError as exc:
                    s.close()
                    if time.monotonic() > deadline:
                        refused = f"connection {len(conns) + 1} still refused after 3 s ({type(exc).__name__})"
                        break
                    time.sleep(0.01)
        time.sleep(1.0)
        r = sc.cli(home, "daemon", "status", timeout=60)
    finally:
        for s in conns:
            s.close()
    problems: list[str] = []
    notes: list[str] = []
    if r.timed_out:
        problems.append("`memories daemon status` did not end within 60 s (killed)")
    elif r.rc != 0 and not (len(r.err_lines) == 1 and r.err_lines[0].startswith("error[")):
        problems.append(f"`memories daemon status` neither answered nor failed with a one-line error: {r.brief()}")
    elif r.rc != 0 and "daemon_unreachable" not in r.err_lines[0]:
        notes.append("a one-line error other than daemon_unreachable (accepted: it ends at once and says why)")
    if b"Traceback" in r.err:
        problems.append("the CLI printed a traceback")
    log_size = d.log_path.stat().st_size if d.log_path.exists() else 0
    if log_size >= 1024 * 1024:
        problems.append("the daemon log grew past 1 MiB")
    answered = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not answered:
        try:
            d.call("daemon.status", timeout=5)
            answered = True
        except (OSError, ConnectionError, DaemonError):
            time.sleep(0.5)
    if not answered:
        problems.append("daemon.status got no answer within 20 s after the idle connections closed")
    detail = (f"{len(conns)} idle connections opened{'; ' + refused if refused else ''}; CLI {r.brief()}; "
              f"log {log_size:,} bytes")
    return (not problems, "; ".join(problems + [detail] + notes))


def pipelined_flood(sc: Scenario) -> Result:
    """50,000 pipelined daemon.status requests whose replies are never read."""
    home = sc.home()
    d = sc.daemon(home)
    for _ in range(3):
        d.call("daemon.status")
    start = d.rss_kib()
    blob = b"".join(frame({"id": i, "method": "daemon.status", "params": {}}) for i in range(50_000))
    flood = d.connect(timeout=30)
    sent = [0]

    def send() -> None:
        view = memoryview(blob)
        try:
            while view:
                n = flood.send(view[: 1 << 16])
                sent[0] += n
                view = view[n:]
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    peak = start
    other: list[Any] = []

    def other_client() -> None:
        time.sleep(1.0)
        t0 = time.monotonic()
        try:
            d.call("daemon.status", timeout=30)
            other.append(time.monotonic() - t0)
        except (OSError, ConnectionError, DaemonError) as exc:
            other.append(exc)

    checker = threading.Thread(target=other_client, daemon=True)
    checker.start()
    t_end = time.monotonic() + 15.0
    while time.monotonic() < t_end:
        if d.alive():
            peak = max(peak, d.rss_kib())
        time.sleep(0.1)
    checker.join(30)
    grown_mib = (peak - start) / 1024
    problems = []
    if grown_mib >= 100:
        problems.append(f"RSS grew by {grown_mib:.0f} MiB")
    if not other:
        problems.append("another client got no answer within 30 s")
    elif isinstance(other[0], Exception):
        problems.append(f"another client failed: {other[0]!r}")
    if not d.alive():
        problems.append("the daemon died")
    flood.close()
    detail = (f"RSS {start / 1024:.0f} -> peak {peak / 1024:.0f} MiB (+{grown_mib:.0f}); {sent[0]:,} of {len(blob):,} "
              f"bytes sent; other client: {_secs(other[0]) if other else 'no answer'}")
    return (not problems, "; ".join(problems + [detail]))


def deep_json(sc: Scenario) -> Result:
    """A frame with JSON nested 5,000 deep, then daemon.status on the same connection."""
    home = sc.home()
    d = sc.daemon(home)
    depth = 5000
    payload = b'{"id":7,"method":"daemon.status","params":{"x":' + b"[" * depth + b"]" * depth + b"}}"
    with d.connect(timeout=10) as s:
        s.sendall(raw_frame(payload))
        try:
            first = recv_reply(s)
        except (OSError, ConnectionError) as exc:
            return False, f"no answer to the deep frame: {exc!r} (the connection was dropped)"
        try:
            second = d.request("daemon.status", sock=s, rid=8)
        except (OSError, ConnectionError) as exc:
            return False, f"deep frame answered {first}; then daemon.status on the same connection failed: {exc!r}"
    ok = code_of(first) == "protocol_error" and "result" in second
    return ok, f"deep frame -> {code_of(first) or 'a result'}; then daemon.status -> {'result' if 'result' in second else second}"


def bad_utf8_filename(sc: Scenario) -> Result:
    """10 good Markdown files and one named b'bad\\xff.md': ingest the folder, then the bad file alone."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    folder = home.parent / "docs"
    write_docs(folder, 10)
    bad = os.fsencode(folder) + b"/bad\xff.md"
    with open(bad, "wb") as f:
        f.write(b"# bad\n\nalpha\n")
    problems = []
    r = sc.cli(home, "--json", "rag", "ingest", vid, str(folder), "--recursive", timeout=60)
    try:
        report = json.loads(r.out.decode("utf-8"))
    except ValueError:
        report = None
    cards = len(d.call("memory.list", {"vault": vid, "kind": "card"})["records"])
    if r.timed_out or b"Traceback" in r.err or report is None:
        problems.append("the folder ingest failed")
    else:
        refused = report.get("refused", [])
        names_bad = [x for x in refused if Path(str(x.get("path", ""))).name.startswith("bad")]
        if report.get("added") != 10 or cards != 10:
            problems.append(f"folder ingest added {report.get('added')} ({cards} cards), want 10")
        if len(names_bad) != 1:
            problems.append(f"the bad file is not named as refused: refused = {refused}")
    r2 = sc.cli(home, "rag", "ingest", vid, bad, timeout=60)
    error_lines = [ln for ln in r2.err_lines if ln.startswith(("error[", "refused:"))]
    if r2.timed_out or r2.rc == 0 or b"Traceback" in r2.err or len(error_lines) != 1:
        problems.append("naming the bad file did not fail with one error line")
    return (not problems, "; ".join(problems + [f"folder: {r.brief()}; direct: {r2.brief()}"]))


def fifo(sc: Scenario) -> Result:
    """`memories memory add VAULT --kind file --file FIFO` (nobody writes to the FIFO)."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    path = home.parent / "fifo"
    os.mkfifo(path)
    r = sc.cli(home, "memory", "add", vid, "--kind", "file", "--file", str(path), timeout=10)
    if r.timed_out:
        return False, "the CLI did not end within 10 s (killed): it blocks opening or reading the FIFO"
    ok = r.rc != 0 and len(r.err_lines) == 1 and b"Traceback" not in r.err
    return ok, r.brief()


def escapes(sc: Scenario) -> Result:
    """A record titled with terminal escapes; `memories memory list` (text) must not pass them through."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    d.call("memory.add", {"vault": vid, "title": "T\x1b]0;pwned\x07\x1b[2J", "body": "x"})
    r = sc.cli(home, "memory", "list", vid, timeout=60)
    if r.timed_out or r.rc != 0:
        return False, f"memory list failed: {r.brief()}"
    both = r.out + r.err
    if b"pwned" not in both:
        return False, f"the record is not listed at all: {both[:300]!r}"
    found = [name for name, byte in (("ESC", b"\x1b"), ("BEL", b"\x07")) if byte in both]
    line = next((ln for ln in both.split(b"\n") if b"pwned" in ln), b"")
    return not found, (f"raw {' and '.join(found)} in the output: {line.strip()[:160]!r}" if found
                       else f"title shown as {line.strip()[:160]!r}")


def wrong_pass_unlocked(sc: Scenario) -> Result:
    """`memories vault unlock` with a wrong passphrase on a vault that is already unlocked."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    r = sc.cli(home, "vault", "unlock", vid, "--passphrase-stdin", stdin=b"not the passphrase\n", timeout=60)
    ok = r.rc not in (0, None) and b"bad_passphrase" in r.err
    return ok, r.brief()


def revision_zero(sc: Scenario) -> Result:
    """memory.read with revision 0 (and -1): the message must not say "None"."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    rid = d.call("memory.add", {"vault": vid, "title": "t", "body": "b"})["id"]
    msgs = [d.request("memory.read", {"vault": vid, "id": rid, "revision": rev}) for rev in (0, -1)]
    problems = [f"revision {rev}: {m}" for rev, m in zip((0, -1), msgs, strict=True)
                if "error" not in m or "None" in str(m["error"].get("message"))]
    shown = "; ".join(f"{code_of(m)}: {(m.get('error') or {}).get('message')}" for m in msgs)
    return not problems, "; ".join(problems) or shown


def unknown_method_families(sc: Scenario) -> Result:
    """rag.status and grant.list are methods of this daemon (never unknown_method)."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    answers = {
        "rag.status": d.request("rag.status", {"vault": vid}),
        "grant.list": d.request("grant.list", {}),
        "grant.list(vault)": d.request("grant.list", {"vault": vid}),
    }
    bad = {k: code_of(m) for k, m in answers.items() if code_of(m) == "unknown_method"}
    return not bad, ", ".join(f"{k} -> {code_of(m) or 'result'}" for k, m in answers.items())


def concurrent_ingest(sc: Scenario) -> Result:
    """Four parallel rag.ingest of one folder of 30 files: no internal error, exactly 30 cards."""
    home = sc.home()
    d = sc.daemon(home)
    vid = create_vault(d)
    folder = home.parent / "docs"
    write_docs(folder, 30)
    answers: list[Any] = []
    lock = threading.Lock()

    def ingest() -> None:
        try:
            msg = d.request("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True}, timeout=60)
        except (OSError, ConnectionError) as exc:
            msg = {"error": {"code": f"connection:{type(exc).__name__}", "message": str(exc)}}
        with lock:
            answers.append(msg)

    threads = [threading.Thread(target=ingest, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = Counter(code_of(m) or "ok" for m in answers)
    added = sum(m["result"]["added"] for m in answers if "result" in m)
    cards = d.call("memory.list", {"vault": vid, "kind": "card"})["records"]
    problems = []
    if len(answers) != 4:
        problems.append(f"only {len(answers)} of 4 ingests answered")
    if any(c != "ok" for c in codes):
        problems.append(f"ingest errors: {dict(codes)}")
    if len(cards) != 30:
        problems.append(f"{len(cards)} cards, want 30")
    return (not problems, "; ".join(problems + [f"answers {dict(codes)}, added {added} in total, {len(cards)} cards"]))


def model_install_bad_range(sc: Scenario) -> Result:
    """A mirror that truncates every whole-file body and answers Range requests with the wrong part."""
    manifest = json.loads((REPO / "models" / "embeddinggemma.json").read_text())
    sizes = {"/" + f["path"]: int(f["size"]) for f in manifest["files"]}
    requests: list[str] = []
    lock = threading.Lock()

    class Mirror(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            rng = self.headers.get("Range")
            with lock:
                requests.append(f"{self.path} range={rng}")
            size = sizes.get(self.path)
            if size is None:
                self.send_error(404)
                return
            if rng:
                # A wrong part: always from byte 0, whatever was asked for.
                body = bytes(min(size, 4096))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/{size}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            # The whole file announced, a third of it sent, then the connection is cut.
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(bytes(max(1, size // 3)))
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    class QuietServer(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the client hanging up on a cut body is the point

    server = QuietServer(("127.0.0.1", 0), Mirror)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        home = sc.home(CHEAP_KDF + f"""
[rag]
model_download_base_url = "http://127.0.0.1:{port}"
[rag.http]
use_env_proxy = false
backoff_ms = 100
""")
        sc.daemon(home)
        r = sc.cli(home, "rag", "model-install", timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    problems = []
    if r.timed_out:
        problems.append("model-install did not end within 60 s (killed)")
    elif r.rc == 0:
        problems.append("model-install reported success")
    if len(requests) >= 20:
        problems.append("20 or more requests to the mirror")
    if b"Traceback" in r.err:
        problems.append("the CLI printed a traceback")
    return (not problems, "; ".join(problems + [f"{len(requests)} requests; {r.brief()}"]))


SCENARIOS: dict[str, tuple[Callable[[Scenario], Result], float]] = {
    "passwd_vs_write": (passwd_vs_write, 90),
    "lock_vs_search": (lock_vs_search, 90),
    "zero_key_vectors": (zero_key_vectors, 240),
    "rollback_head": (rollback_head, 60),
    "concurrent_unlock_default_kdf": (concurrent_unlock_default_kdf, 120),
    "idle_connections": (idle_connections, 130),
    "pipelined_flood": (pipelined_flood, 90),
    "deep_json": (deep_json, 40),
    "bad_utf8_filename": (bad_utf8_filename, 90),
    "fifo": (fifo, 40),
    "escapes": (escapes, 40),
    "wrong_pass_unlocked": (wrong_pass_unlocked, 40),
    "revision_zero": (revision_zero, 40),
    "unknown_method_families": (unknown_method_families, 40),
    "concurrent_ingest": (concurrent_ingest, 90),
    "model_install_bad_range": (model_install_bad_range, 100),
}


# ---------------------------------------------------------------------------------------------- runner


def run_scenario(name: str) -> dict[str, Any]:
    fn, limit = SCENARIOS[name]
    sc = Scenario(name)
    outcome: list[Result] = []

    def target() -> None:
        try:
            outcome.append(fn(sc))
        except Exception as exc:  # reported as the scenario's outcome
            tb = traceback.format_exc(limit=4).strip().splitlines()
            outcome.append((False, f"the scenario failed: {exc!r} ({' / '.join(tb[-3:])})"))

    t0 = time.monotonic()
    worker = threading.Thread(target=target, name=f"scenario-{name}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        sc.kill_all()  # whatever it waits on ends now
        worker.join(10)
        ok, detail = False, f"timed out after {limit:.0f} s: its daemon and CLI processes were killed"
    else:
        ok, detail = outcome[0]
    seconds = round(time.monotonic() - t0, 2)
    sc.cleanup()
    return {"ok": bool(ok), "detail": detail, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this scenario (repeatable, or comma-separated)")
    parser.add_argument("--list", action="store_true", help="list the scenario names and exit")
    parser.add_argument("--model-dir", type=Path, default=MINILM,
                        help=f"the small embedding model for zero_key_vectors (default {MINILM})")
    parser.add_argument("--keep", action="store_true", help="keep the throw-away homes (for a post-mortem)")
    args = parser.parse_args(argv)
    OPTIONS["model_dir"] = args.model_dir.resolve()
    OPTIONS["keep"] = args.keep
    if args.list:
        print("\n".join(SCENARIOS))
        return 0
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; see --list")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"[attack] {name} ...", file=sys.stderr, flush=True)
        results[name] = run_scenario(name)
        r = results[name]
        print(f"[attack] {name}: {'ok' if r['ok'] else 'FOUND'} ({r['seconds']} s) {r['detail'][:200]}",
              file=sys.stderr, flush=True)
    found = sum(1 for r in results.values() if not r["ok"])
    print(json.dumps({"scenarios": results, "found": found}, indent=2, ensure_ascii=True))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
