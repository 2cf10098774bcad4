"""Real loopback servers for tests that touch the network (importable by any test file).

* :class:`Mirror` — a threaded HTTP/1.1 server on 127.0.0.1 that serves files
  (with ``Range`` support) and answers POSTs, with fault injection through
  scripted responses: a status with headers and body, a delay before the
  answer or an answer held until the test releases it, a connection dropped
  after N body bytes, a body trickled slowly, a server that ignores ``Range``.
  Optionally HTTPS (see :func:`make_test_ca`). Every request is recorded (method, path, headers, body).
* :class:`ConnectProxy` — records the ``CONNECT host:port`` line (and headers)
  it receives, answers 502 and closes.
* :class:`Socks5Proxy` — speaks the SOCKS5 greeting, records the CONNECT
  request's host and port, answers "host unreachable" and closes.

All servers bind port 0 on 127.0.0.1, run in a daemon thread and are context managers.
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")
HOLD_SECONDS = 120.0


@dataclass
class Scripted:
    """One scripted answer. ``body=None`` serves the file at the path (if any)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    delay: float = 0.0  # seconds before answering
    #: Answer only once this event is set (at most HOLD_SECONDS): a request provably in flight for as
    #: long as the test needs, whatever the machine's speed. The test sets it when done (also on failure).
    hold: threading.Event | None = None
    drop_after: int | None = None  # send the full headers, then this many body bytes, then close
    trickle: tuple[int, float] | None = None  # (bytes per write, seconds between writes)
    ignore_range: bool = False  # answer 200 with the whole file even if Range was asked

    @staticmethod
    def json(status: int, data: Any, **kw: Any) -> Scripted:
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        return Scripted(status=status, headers=headers, body=json.dumps(data).encode(), **kw)


@dataclass
class Seen:
    method: str
    path: str  # as sent, with any query
    headers: dict[str, str]  # lower-case names
    body: bytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _MirrorHTTPServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_POST(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        mirror = self.server.mirror
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        path = self.path.partition("?")[0]
        with mirror.lock:
            mirror.requests.append(seen)
            queue = mirror.script.get(path)
            step = queue.pop(0) if queue else None
        step = step or Scripted(ignore_range=mirror.ignore_range)
        if step.delay:
            time.sleep(step.delay)
        if step.hold is not None:
            step.hold.wait(HOLD_SECONDS)
        try:
            if step.body is not None or step.status != 200 or path not in mirror.files:
                if step.body is not None:
                    status, data = step.status, step.body
                elif step.status != 200:
                    status, data = step.status, b""
                else:
                    status, data = 404, b'{"error": {"message": "no such file"}}'
                self._send(status, step.headers, data, step, head=head)
                return
            data = mirror.files[path]
            status, headers = step.status, dict(step.headers)
            rng = _RANGE_RE.match(self.headers.get("Range", "")) if not step.ignore_range else None
            if rng and status == 200:
                start = int(rng.group(1))
                if start >= len(data):
                    self._send(416, {"Content-Range": f"bytes */{len(data)}"}, b"", step, head=head)
                    return
                end = int(rng.group(2)) if rng.group(2) else len(data) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                data, status = data[start : end + 1], 206
            headers.setdefault("Accept-Ranges", "bytes")
            self._send(status, headers, data, step, head=head)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    def _send(self, status: int, headers: dict[str, str], data: bytes, step: Scripted, *, head: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if head:
            return
        if step.drop_after is not None:
            self.wfile.write(data[: step.drop_after])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if step.trickle is not None:
            size, pause = step.trickle
            for i in range(0, len(data), size):
                if self.server.stopping.is_set():
                    break
                self.wfile.write(data[i : i + size])
                self.wfile.flush()
                time.sleep(pause)
            self.close_connection = True
            return
        self.wfile.write(data)


class _MirrorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.stopping = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # handshake failures and dropped clients are part of the tests


class _Base:
    """Start/stop plumbing shared by the servers."""

    _server: socketserver.BaseServer
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])  # type: ignore[index]

    def start(self) -> Any:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        stopping = getattr(self._server, "stopping", None)
        if stopping is not None:
            stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Mirror(_Base):
    """A file-serving (and POST-answering) loopback server with scripted faults."""

    def __init__(self, files: dict[str, bytes] | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.script: dict[str, list[Scripted]] = {}
        self.requests: list[Seen] = []
        self.ignore_range = False
        self.lock = threading.Lock()
        self.tls = tls
        self._server = _MirrorHTTPServer(self)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def add(self, path: str, *steps: Scripted) -> None:
        """Queue scripted answers for ``path`` (used in order, then the default)."""
        with self.lock:
            self.script.setdefault(path, []).extend(steps)

    def seen(self, path: str | None = None) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path.partition("?")[0] == path]


# ---------------------------------------------------------------------------
# Proxies that record what they saw
# ---------------------------------------------------------------------------


class _Recording(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[socketserver.BaseRequestHandler]) -> None:
        self.seen: list[Any] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


class _ConnectHandler(socketserver.BaseRequestHandler):
    server: _Recording

    def handle(self) -> None:
        self.request.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = self.request.recv(4096)
            if not chunk:
                break
            data += chunk
        head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
        lines = head.split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        with self.server.lock:
            self.server.seen.append({"line": lines[0], "headers": headers})
        try:
            self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass


class ConnectProxy(_Base):
    """An HTTP proxy that records each request line (``CONNECT host:443 HTTP/1.1``) and refuses it."""

    def __init__(self) -> None:
        self._server = _Recording(_ConnectHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def lines(self) -> list[str]:
        with self._server.lock:  # type: ignore[attr-defined]
            return [s["line"] for s in self._server.seen]  # type: ignore[attr-defined]


class _SocksHandler(socketserver.BaseRequestHandler):
    server: _Recording

    def handle(self) -> None:
        sock = self.request
        sock.settimeout(5)
        try:
            ver, nmethods = _read_exact(sock, 2)
            _read_exact(sock, nmethods)
            sock.sendall(b"\x05\x00")  # no authentication
            ver, cmd, _rsv, atyp = _read_exact(sock, 4)
            if atyp == 1:
                host = socket.inet_ntop(socket.AF_INET, _read_exact(sock, 4))
            elif atyp == 4:
                host = socket.inet_ntop(socket.AF_INET6, _read_exact(sock, 16))
            else:
                host = _read_exact(sock, _read_exact(sock, 1)[0]).decode("ascii", "replace")
            port = int.from_bytes(_read_exact(sock, 2), "big")
            with self.server.lock:
                self.server.seen.append({"version": ver, "cmd": cmd, "atyp": atyp, "host": host, "port": port})
            sock.sendall(b"\x05\x04\x00\x01\x00\x00\x00\x00\x00\x00")  # host unreachable
        except (OSError, ValueError):
            return


class Socks5Proxy(_Base):
    """A SOCKS5 proxy that records each CONNECT request (host, port) and refuses it."""

    def __init__(self) -> None:
        self._server = _Recording(_SocksHandler)

    def url(self, scheme: str = "socks5") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._server.lock:  # type: ignore[attr-defined]
            return list(self._server.seen)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# TLS material for HTTPS mirrors (openssl CLI; no cryptography.hazmat outside vault/crypto.py)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopbackCA:
    ca_file: Path  # give this to HttpConfig.ca_bundle
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def _openssl(args: Iterable[str], cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_test_ca(directory: Path) -> LoopbackCA:
    """A throw-away CA and a server certificate for 127.0.0.1 and localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Memories test CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        directory,
    )
    _openssl(["req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"], directory)
    (directory / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"],
        directory,
    )
    return LoopbackCA(directory / "ca.pem", directory / "server.pem", directory / "server.key")
