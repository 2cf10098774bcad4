"""Trust under concurrency (issue 13): connection limits, idle timeouts, backpressure, keep-alives,
protocol abuse, loud handler imports and log flood control, against real daemon processes."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import parse_config
from memoriesd.errors import EXIT_UNREACHABLE, ConfigError
from memoriesd.server import protocol
from memoriesd.server.lograte import LogRateLimit
from memoriesd.workers.routes import ENDING

from .conftest import REPO, Daemon, create_vault, run_cli, running_daemon, short_tmpdir, write_config


def _connect(d: Daemon, timeout: float = 10.0) -> socket.socket:
    """Connect with a timeout: a daemon that stopped accepting leaves a blocking connect() hanging.
    (A Unix socket's connect fails at once with EAGAIN while the listen backlog is full: retried.)"""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(d.socket_path))
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        except OSError:
            s.close()
            raise


def _frame(sock: socket.socket, timeout: float = 10.0) -> dict[str, Any]:
    sock.settimeout(timeout)
    return protocol.recv_frame(sock)


def _status(sock: socket.socket, rid: int = 1) -> dict[str, Any]:
    sock.sendall(protocol.encode({"id": rid, "method": "daemon.status", "params": {}}))
    while True:
        msg = _frame(sock)
        if "progress" not in msg:
            return msg


def _routed(d: Daemon, rid: int, method: str, params: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """Send one request to the process that serves it, as the CLI does, and read its first frame. A
    vault's process that is ending (the wrong guess before ended it) answers vault_process_ending or
    drops the connection having run nothing: ask for the route again, as the CLI does."""
    for _ in range(20):
        try:
            s = d.connect_for(method, params)
        except (ConnectionError, FileNotFoundError):  # it ended between the route and the connect
            continue
        try:
            s.sendall(protocol.encode({"id": rid, "method": method, "params": params}))
            msg = _frame(s, 60)
        except ConnectionError:
            s.close()
            continue
        if msg.get("error", {}).get("code") == ENDING:
            s.close()
            continue
        return s, msg
    raise AssertionError(f"the process serving {method} was ending every time")


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Read (and drop) whatever is buffered; True once the daemon closed its end within ``within`` s."""
    deadline = time.monotonic() + within
    sock.setblocking(False)
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.1)
        if not ready:
            continue
        try:
            while True:
                data = sock.recv(1 << 20)
                if not data:
                    return True
        except BlockingIOError:
            continue
        except ConnectionError:
            return True
    return False


def _hold(d: Daemon, n: int) -> tuple[list[socket.socket], int]:
    """``n`` connections the daemon serves, and how many attempts were refused on the way (a client's
    close is seen by the daemon a moment later, e.g. the start-up probe's)."""
    held: list[socket.socket] = []
    refused = 0
    deadline = time.monotonic() + 60
    while len(held) < n:
        s = _connect(d)
        try:
            reply = _status(s)
        except OSError:
            reply = {}
        if "result" in reply:
            held.append(s)
            continue
        assert reply.get("error", {}).get("code") in (None, "busy"), reply
        refused += 1
        s.close()
        assert time.monotonic() < deadline, "the daemon never freed a slot"
        time.sleep(0.05)
    return held, refused


def _expect_busy(sock: socket.socket) -> dict[str, Any]:
    msg = _frame(sock)
    assert msg["error"]["code"] == "busy", msg
    assert _closed_by_peer(sock, 10)
    return msg


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextlib.contextmanager
def _daemon(daemon_keys: str = "", unlock_delay_ms: int = 20) -> Iterator[Daemon]:
    """A daemon whose config has these ``[daemon]`` keys and a fixed wrong-passphrase delay."""
    root = short_tmpdir()
    home = root / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        f"[daemon]\n{daemon_keys}\n[vault]\nkdf_memory_kib = 64\nkdf_iterations = 1\nkdf_lanes = 1\n"
        f"unlock_delay_step_ms = {unlock_delay_ms}\nunlock_delay_max_ms = {unlock_delay_ms}\n"
    )
    d = Daemon(home).start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _settled_rss_mib(pid: int) -> float:
    """The daemon's RSS once its start-up work (warming the retrieval engine) is over."""
    last = _rss_mib(pid)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _rss_mib(pid)
        if abs(now - last) < 1:
            return now
        last = now
    return last


def _pid(d: Daemon) -> int:
    assert d.proc is not None
    return d.proc.pid


# --------------------------------------------------------------------------- connection limit


def test_a_connection_over_max_connections_gets_busy_and_is_closed() -> None:
    with running_daemon("[daemon]\nmax_connections = 4\n") as d:
        held, _ = _hold(d, 4)
        try:
            extra = _connect(d)
            msg = _expect_busy(extra)
            extra.close()
            assert "4 connections" in msg["error"]["message"] and "retry" in msg["error"]["message"]
            # The CLI says so in one line and exits like an unreachable daemon.
            r = run_cli(d.home, "daemon", "status", timeout=60)
            assert r.returncode == EXIT_UNREACHABLE, (r.returncode, r.stderr)
            assert r.stderr.startswith("error[busy]:") and r.stderr.count("\n") == 1, r.stderr
            # The held connections keep working, and a freed slot is usable again.
            assert "result" in _status(held[0], 2)
            held.pop().close()
            deadline = time.monotonic() + 60
            while True:
                s = _connect(d)
                reply = _status(s)
                s.close()
                if "result" in reply or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert "result" in reply, reply
        finally:
            for s in held:
                s.close()


def test_the_connection_limit_is_capped_below_a_lowered_open_file_limit() -> None:
    """ulimit -n 256 with the default max_connections (256, so the open-file limit decides):
    over-limit connections are refused, the log stays small, and once the idle connections close the
    daemon answers again."""

    def low_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    root = short_tmpdir()
    home = root / "h"
    write_config(home)
    d = Daemon(home).start(preexec_fn=low_nofile)
    socks: list[socket.socket] = []
    try:
        for _ in range(400):
            socks.append(_connect(d))
        # Every connection is either served (it answers a request) or refused with one busy frame and
        # closed: ask each, whatever the order and speed in which the daemon accepts them.
        refused, served = 0, []
        for s in socks:
            with contextlib.suppress(OSError):  # refused and closed already: its busy frame is still there to read
                s.sendall(protocol.encode({"id": 1, "method": "daemon.status", "params": {}}))
            msg = _frame(s, 60)
            if "error" in msg:
                assert msg["error"]["code"] == "busy", msg
                refused += 1
            else:
                assert "result" in msg, msg
                served.append(s)
        assert refused >= 400 - 256, refused
        assert 16 <= len(served) < 256 - 16, len(served)
        for s in served[:5]:
            assert "result" in _status(s, 2)
        # While full, a new client is refused clearly (never left hanging).
        extra = _connect(d)
        _expect_busy(extra)
        extra.close()
        for s in socks:
            s.close()
        socks.clear()
        deadline = time.monotonic() + 60
        while True:
            s = _connect(d)
            reply = _status(s)
            s.close()
            if "result" in reply or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert "result" in reply, reply
        assert d.proc is not None and d.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        d.stop()
        size = (home / "logs" / "memoriesd.log").stat().st_size
        log_text = d.log_text()
        shutil.rmtree(root, ignore_errors=True)
    assert size < 200 * 1024, size
    assert "out of system resource" not in log_text


# --------------------------------------------------------------------------- idle timeout


def test_idle_connections_are_closed_but_not_while_a_request_runs() -> None:
    with _daemon("idle_timeout_seconds = 1\nkeepalive_seconds = 0.3", unlock_delay_ms=2500) as d:
        vid = create_vault(d)
        d.call("vault.lock", {"vault": vid})
        assert "error" in d.request("vault.unlock", {"vault": vid, "passphrase": "wrong"})
        started = time.monotonic()  # before either connection: the idle timeout counts from its accept
        idle = _connect(d)
        # A 2.5 s unlock (the delay earned by the wrong passphrase) outlives the 1 s idle timeout; it
        # runs in the vault's own process (started for it).
        busy, msg = _routed(d, 7, "vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        try:
            assert _closed_by_peer(idle, 60), "an idle connection was never closed"
            assert time.monotonic() - started >= 0.9
            while "progress" in msg:
                msg = _frame(busy)
            assert msg.get("result", {}).get("vault_id") == vid, msg
            assert time.monotonic() - started >= 2.4
        finally:
            idle.close()
            busy.close()


def test_idle_timeout_zero_keeps_connections() -> None:
    with running_daemon("[daemon]\nidle_timeout_seconds = 0\n") as d:
        s = _connect(d)
        try:
            assert not _closed_by_peer(s, 2.5)
            s.setblocking(True)
            assert "result" in _status(s)
        finally:
            s.close()


# --------------------------------------------------------------------------- backpressure


def test_pipelined_unread_requests_keep_the_daemon_bounded_and_the_reader_is_cut_off() -> None:
    with running_daemon("[daemon]\nwrite_timeout_seconds = 3\n") as d:
        pid = _pid(d)
        before = _settled_rss_mib(pid)
        data = b"".join(protocol.encode({"id": i, "method": "daemon.status", "params": {}}) for i in range(50_000))
        s = _connect(d)
        try:
            s.setblocking(False)
            sent, stalled_since = 0, None
            while sent < len(data):
                try:
                    sent += s.send(data[sent : sent + 65536])
                    stalled_since = None
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 1.5:
                        break  # backpressure: the daemon stopped reading
                    time.sleep(0.01)
            time.sleep(1.0)
            grown = _rss_mib(pid) - before
            assert sent < len(data), "the daemon read 50,000 requests it could not answer"
            assert grown < 48, f"the daemon grew by {grown:.0f} MiB"
            # Another client is served meanwhile.
            other = _connect(d)
            try:
                assert "result" in _status(other)
            finally:
                other.close()
            # A client that does not read its replies is cut off after the write timeout (3 s): reading
            # before then would unblock the daemon, so read only once the daemon says it cut one off.
            deadline = time.monotonic() + 60
            while "cut off a client" not in d.log_text():
                assert time.monotonic() < deadline, "the non-reading client was never cut off"
                time.sleep(0.1)
            assert _closed_by_peer(s, 60), "the non-reading client was never cut off"
        finally:
            s.close()
        assert d.call("daemon.status")["pid"] == pid
        assert _rss_mib(pid) - before < 48


def test_in_flight_requests_per_connection_are_bounded_without_losing_any() -> None:
    """More pipelined requests than the in-flight bound, read by the client: every one is answered."""
    with running_daemon("[daemon]\nmax_requests_per_connection = 2\n") as d:
        s = _connect(d)
        try:
            s.sendall(b"".join(protocol.encode({"id": i, "method": "daemon.status", "params": {}}) for i in range(200)))
            ids = set()
            while len(ids) < 200:
                msg = _frame(s)
                assert "result" in msg, msg
                ids.add(msg["id"])
            assert ids == set(range(200))
        finally:
            s.close()


# --------------------------------------------------------------------------- protocol abuse


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_json_is_a_protocol_error_and_the_connection_stays_usable(depth: int) -> None:
    with running_daemon() as d:
        s = _connect(d)
        try:
            body = b'{"id":1,"method":"daemon.status","params":{"x":' + b"[" * depth + b"]" * depth + b"}}"
            s.sendall(struct.pack(">I", len(body)) + body)
            msg = _frame(s)
            assert msg["error"]["code"] == "protocol_error", msg
            assert "result" in _status(s, 2)
        finally:
            s.close()


def test_decode_turns_every_failure_into_a_protocol_error() -> None:
    from memoriesd.errors import ProtocolError

    for payload in (b"[" * 50_000, b"\xff", b"1e999999", b"[1]", b'"x"'):
        with pytest.raises(ProtocolError):
            protocol.decode(payload)


# --------------------------------------------------------------------------- loud handler imports


@pytest.mark.parametrize("module", ["memoriesd.server.grants", "memoriesd.server.methods.search", "memoriesd.rag.engine"])
def test_a_broken_handler_import_stops_the_daemon_at_start(module: str) -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home)
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # any import of it now raises ImportError\n"
        "from memoriesd.main import main\n"
        "main()\n"
    )
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--home", str(home)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=str(REPO),
        )
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the daemon started without {module}: a method family would silently be missing")
        finally:
            err = proc.stderr.read().decode() if proc.stderr else ""
            if proc.stderr:
                proc.stderr.close()
        assert proc.returncode != 0
        assert "ImportError" in err or "ModuleNotFoundError" in err, err
        assert not (home / "run" / "memoriesd.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_every_method_family_is_registered() -> None:
    with running_daemon() as d:
        for method in ("grant.list", "rag.status"):
            reply = d.request(method, {})
            assert reply.get("error", {}).get("code") != "unknown_method", (method, reply)


@pytest.mark.parametrize(("module", "group"), [("memories_cli.rag_cmds", "rag"), ("memories_cli.grant_cmds", "grant")])
def test_a_broken_cli_command_group_import_fails_loudly(module: str, group: str) -> None:
    """The CLI twin of the daemon's eager imports: never a silent "No such command 'rag'" (groups are
    imported when they run, memories_cli/lazy.py; tests/test_help.py loads every one)."""
    code = f"import sys\nsys.modules[{module!r}] = None\nfrom memories_cli.main import run\nrun()\n"
    r = subprocess.run(
        [sys.executable, "-c", code, group, "--help"], capture_output=True, text=True, cwd=str(REPO), timeout=60
    )
    assert r.returncode != 0, r.stdout
    assert "ModuleNotFoundError" in r.stderr and module in r.stderr, r.stderr


# --------------------------------------------------------------------------- the log


def test_repeated_log_lines_are_rate_limited_with_one_summary() -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, "[daemon]\nmax_connections = 1\n")
    d = Daemon(home).start()
    try:
        (held,), busy = _hold(d, 1)
        for _ in range(300):
            s = _connect(d)
            assert _frame(s)["error"]["code"] == "busy"
            busy += 1
            s.close()
        held.close()
    finally:
        d.stop()
    text = d.log_text()
    shutil.rmtree(root, ignore_errors=True)
    refusals = [ln for ln in text.splitlines() if "refused a connection" in ln and "suppressed" not in ln]
    assert 1 <= len(refusals) <= 10, len(refusals)
    summaries = [ln for ln in text.splitlines() if "suppressed" in ln]
    assert len(summaries) == 1, summaries
    assert f"suppressed {busy - len(refusals)} " in summaries[0], summaries[0]


def test_the_log_rate_limit_filter() -> None:
    now = [0.0]
    out: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(record)

    handler = Collect()
    limit = LogRateLimit(handler, per_window=10, window=60.0, clock=lambda: now[0])
    handler.addFilter(limit)
    logger = logging.getLogger("memoriesd.test_rate")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for i in range(1000):
            logger.error("accept failed on fd %d", i)
        logger.info("something else")
        assert len(out) == 11
        now[0] = 61.0
        logger.error("accept failed on fd %d", 5)  # a new window: first the summary, then the line
        assert [r.getMessage() for r in out[-2:]][1] == "accept failed on fd 5"
        assert "990" in out[-2].getMessage() and "suppressed" in out[-2].getMessage()
        # Texts that differ only in numbers are one template.
        for i in range(20):
            logger.warning(f"closed connection {i} after {i * 3} s")
        assert len(out) == 13 + 10
        now[0] = 200.0
        limit.flush()
        assert "10 " in out[-1].getMessage() and "suppressed" in out[-1].getMessage()
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------- CLI timeout and keep-alives


def test_the_cli_gives_up_on_a_stopped_daemon_with_daemon_unreachable() -> None:
    with running_daemon() as d:
        pid = _pid(d)
        os.kill(pid, signal.SIGSTOP)
        try:
            r = run_cli(d.home, "daemon", "status", env={"MEMORIES_CLIENT_TIMEOUT": "2"}, timeout=120)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert r.returncode == EXIT_UNREACHABLE, (r.returncode, r.stderr)
        assert r.stderr.startswith("error[daemon_unreachable]:") and r.stderr.count("\n") == 1, r.stderr
        assert "2 s" in r.stderr and "memoriesd" in r.stderr  # it gave up by its own timeout
        assert d.call("daemon.status")["pid"] == pid


def test_long_requests_send_keepalives_and_the_cli_ignores_them() -> None:
    with _daemon("keepalive_seconds = 0.2", unlock_delay_ms=4000) as d:
        vid = create_vault(d)
        d.call("vault.lock", {"vault": vid})
        assert "error" in d.request("vault.unlock", {"vault": vid, "passphrase": "wrong"})
        # Raw: the 4 s unlock sends keep-alive progress frames, then its answer.
        s, msg = _routed(d, 9, "vault.unlock", {"vault": vid, "passphrase": "wrong again"})
        try:
            keepalives = 0
            while "progress" in msg:
                assert msg == {"id": 9, "progress": {"keepalive": True}}, msg
                keepalives += 1
                msg = _frame(s)
        finally:
            s.close()
        assert msg["error"]["code"] == "bad_passphrase", msg
        assert keepalives >= 2, keepalives  # every 0.2 s: more than one in 4 s however loaded the machine
        # The CLI waits through a request (4 s) longer than its silence timeout (2 s, ten keep-alive
        # intervals) and prints nothing extra.
        r = run_cli(
            d.home, "vault", "unlock", vid, "--passphrase-stdin", input="correct horse\n", env={"MEMORIES_CLIENT_TIMEOUT": "2"}
        )
        assert r.returncode == 0, r.stderr
        assert "keepalive" not in r.stdout + r.stderr
        assert d.call("vault.status", {"vault": vid})["locked"] is False


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "toml",
    [
        {"daemon": {"max_connections": 0}},
        {"daemon": {"idle_timeout_seconds": -1}},
        {"daemon": {"max_requests_per_connection": 0}},
        {"daemon": {"write_timeout_seconds": 0}},
        {"daemon": {"keepalive_seconds": 60}},
    ],
)
def test_new_daemon_keys_are_validated(toml: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(toml, REPO)
    assert next(iter(toml["daemon"])) in ei.value.message


def test_new_daemon_keys_have_defaults() -> None:
    cfg = parse_config({}, REPO).daemon
    assert (cfg.max_connections, cfg.idle_timeout_seconds, cfg.max_requests_per_connection) == (256, 600.0, 32)
    assert (cfg.write_timeout_seconds, cfg.keepalive_seconds) == (30.0, 10.0)
