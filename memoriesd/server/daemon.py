"""`memoriesd`: the long-running daemon on a Unix socket in the Memories home.

One daemon per home (an flock on ``run/memoriesd.lock``). Every connection's peer uid is checked
with SO_PEERCRED. Requests are served concurrently in worker threads; one bad client never
affects others. SIGTERM/SIGINT: stop accepting, let in-flight writes finish, lock (wipe) every
vault, remove the socket and pid file, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Before anything can import onnxruntime (see SECURITY.md: no telemetry files).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from .. import __version__  # noqa: E402
from ..config import Config, load_config  # noqa: E402
from ..errors import (  # noqa: E402
    DaemonRunning,
    FrameTooLarge,
    Internal,
    InvalidParams,
    MemoriesError,
    ProtocolError,
    UnknownMethod,
    VaultLocked,
)
from ..home import Home, resolve_home  # noqa: E402
from ..vault.crypto import KeyWiped  # noqa: E402
from ..vault.manager import VaultManager  # noqa: E402
from . import protocol  # noqa: E402
from .context import Context, Params  # noqa: E402
from .handlers import HANDLERS  # noqa: E402

try:  # method groups register themselves in HANDLERS on import
    from . import grants as _grants  # noqa: E402,F401
except ImportError:  # pragma: no cover - until grants exist
    pass
try:
    from . import rag_handlers as _rag_handlers  # noqa: E402,F401
except ImportError:  # pragma: no cover
    pass

log = logging.getLogger("memoriesd")


def harden() -> None:
    """No core dumps, not ptrace-able by same-uid processes where the kernel allows, private files."""
    os.umask(0o077)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_DUMPABLE = 4
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def setup_logging(home: Home, level: str) -> None:
    fd = os.open(home.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8", buffering=1))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for noisy in ("jieba", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class App:
    """Everything a handler may use: home, config, vaults and the retrieval engine."""

    def __init__(self, home: Home, config: Config) -> None:
        self.home = home
        self.config = config
        self.vaults = VaultManager(home, config)
        self.started = time.monotonic()
        self._stop_cb: Any = None
        self.rag: Any = None
        try:
            from ..rag.engine import RagEngine  # noqa: PLC0415 - optional until the engine exists

            self.rag = RagEngine(self)
        except ImportError:
            self.rag = None

    def request_stop(self) -> None:
        if self._stop_cb is not None:
            self._stop_cb()

    def dispatch(self, method: str, ctx: Context) -> dict[str, Any]:
        handler = HANDLERS.get(method)
        if handler is None:
            raise UnknownMethod(f"unknown method {method!r}: the CLI and daemon versions may differ")
        try:
            if ctx.grant is None:
                return handler(self, ctx)
            from .grants import run_granted  # noqa: PLC0415

            return run_granted(self, ctx, method, handler)
        except KeyWiped as exc:  # the vault was locked under the operation (past the drain bound)
            raise VaultLocked("the vault was locked during the operation: unlock it and run the command again") from exc
        finally:
            ctx.release()


class Connection:
    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.write_lock = asyncio.Lock()
        self.cancelled = threading.Event()
        self.grant: Any = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def send(self, message: dict[str, Any]) -> None:
        try:
            data = protocol.encode(message, self.server.max_frame * 2)
        except FrameTooLarge as exc:
            data = protocol.encode({"id": message.get("id"), "error": exc.to_dict()})
        async with self.write_lock:
            if self.writer.is_closing():
                return
            self.writer.write(data)
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    header = await self.reader.readexactly(protocol.HEADER.size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (n,) = protocol.HEADER.unpack(header)
                if n > self.server.max_frame:
                    err = FrameTooLarge(
                        f"the request frame is {n:,} bytes, over the {self.server.max_frame // (1024 * 1024)} MiB limit"
                    )
                    await self.send({"id": None, "error": err.to_dict()})
                    return  # the stream cannot be resynchronised without reading it
                try:
                    payload = await self.reader.readexactly(n)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    req = protocol.decode(payload)
                except ProtocolError as exc:
                    await self.send({"id": None, "error": exc.to_dict()})
                    continue
                task = loop.create_task(self.handle(req))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            self.cancelled.set()
            if self.tasks:
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
            with contextlib.suppress(Exception):
                self.writer.close()

    async def handle(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        loop = asyncio.get_running_loop()
        try:
            method = req.get("method")
            if not isinstance(method, str):
                raise InvalidParams("the request has no method")
            if method == "session.grant":
                from .grants import present_grant  # noqa: PLC0415

                result = await loop.run_in_executor(self.server.pool, present_grant, self.server.app, self, Params(req.get("params")))
                await self.send({"id": rid, "result": result})
                return

            def progress(p: dict[str, Any]) -> None:
                asyncio.run_coroutine_threadsafe(self.send({"id": rid, "progress": p}), loop)

            ctx = Context(Params(req.get("params")), progress, self.cancelled, self.grant)
            result = await loop.run_in_executor(self.server.pool, self.server.app.dispatch, method, ctx)
            await self.send({"id": rid, "result": result})
        except MemoriesError as exc:
            if exc.code in ("internal",):
                log.error("request failed: %s", exc.code)
            await self.send({"id": rid, "error": exc.to_dict()})
        except Exception:
            log.exception("internal error in %s", req.get("method") if isinstance(req.get("method"), str) else "?")
            err = Internal("the daemon hit an internal error; details are in the daemon log (logs/memoriesd.log)")
            await self.send({"id": rid, "error": err.to_dict()})


class Server:
    def __init__(self, app: App) -> None:
        self.app = app
        self.max_frame = app.config.daemon.max_frame_mib * 1024 * 1024
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="memoriesd")
        self.allowed_uids = {os.getuid()}
        if app.config.daemon.test_allow_uid >= 0:
            self.allowed_uids.add(app.config.daemon.test_allow_uid)
        self.stopping = asyncio.Event()
        self.connections: set[Connection] = set()

    def peer_uid(self, writer: asyncio.StreamWriter) -> int | None:
        sock = writer.get_extra_info("socket")
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = self.peer_uid(writer)
        if uid not in self.allowed_uids:
            log.warning("refused a connection from uid %s", uid)
            err = {"code": "peer_refused", "message": "this daemon serves only its own user"}
            with contextlib.suppress(Exception):
                writer.write(protocol.encode({"id": None, "error": err}))
                await writer.drain()
                writer.close()
            return
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    async def auto_lock_loop(self) -> None:
        minutes = self.app.config.daemon.auto_lock_minutes
        if minutes <= 0:
            return
        interval = max(0.05, min(1.0, minutes * 60 / 4))
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            await asyncio.sleep(interval)
            await loop.run_in_executor(self.pool, self.app.vaults.expire_idle)

    async def run(self) -> None:
        home = self.app.home
        loop = asyncio.get_running_loop()
        server = await asyncio.start_unix_server(self.on_client, path=str(home.socket_path), limit=1 << 20)
        os.chmod(home.socket_path, 0o600)
        self.app._stop_cb = lambda: loop.call_soon_threadsafe(self.stopping.set)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("memoriesd %s serving (pid %d)", __version__, os.getpid())
        print(f"memoriesd {__version__} listening on {home.socket_path}", file=sys.stderr, flush=True)
        auto = loop.create_task(self.auto_lock_loop())
        if self.app.rag is not None:
            loop.run_in_executor(self.pool, self.app.rag.warm)
        try:
            await self.stopping.wait()
        finally:
            log.info("stopping")
            server.close()
            auto.cancel()
            for conn in list(self.connections):
                conn.cancelled.set()
            # In-flight writes finish (each batch is atomic); give them a moment.
            self.pool.shutdown(wait=True, cancel_futures=True)
            await asyncio.to_thread(self.app.vaults.lock_all, "shutdown")
            with contextlib.suppress(FileNotFoundError):
                home.socket_path.unlink()


def acquire_lock(home: Home) -> int:
    fd = os.open(home.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise DaemonRunning(
            f"another memoriesd is already running for the home {home.root}: stop it with `memories daemon stop`"
        ) from exc
    return fd


def run_daemon(home: Home) -> int:
    home.ensure()
    home.check_socket_path()
    config = load_config(home.config_path)
    lock_fd = acquire_lock(home)
    try:
        setup_logging(home, config.daemon.log_level)
        # We hold the lock, so any socket or pid file left behind is stale (a crash).
        for stale in (home.socket_path, home.pid_path):
            if stale.exists():
                logging.getLogger("memoriesd").warning("removed a stale %s from an earlier crash", stale.name)
                stale.unlink()
        home.pid_path.write_text(f"{os.getpid()}\n")
        app = App(home, config)
        try:
            asyncio.run(Server(app).run())
        finally:
            with contextlib.suppress(FileNotFoundError):
                home.pid_path.unlink()
        log.info("stopped")
        return 0
    finally:
        os.close(lock_fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="memoriesd",
        description="The Memories daemon: keeps vaults decrypted only in its own memory and serves the "
        "`memories` CLI over a Unix socket in the Memories home. Runs in the foreground.",
    )
    parser.add_argument("--home", help="Memories home (default: $MEMORIES_HOME, else ~/.memories)")
    parser.add_argument("--version", action="version", version=f"memoriesd {__version__}")
    args = parser.parse_args(argv)
    harden()
    try:
        home = resolve_home(args.home)
        code = run_daemon(home)
    except MemoriesError as exc:
        print(f"memoriesd: error[{exc.code}]: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


def json_dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


if __name__ == "__main__":
    main()


__all__ = ["main", "App", "Server", "Path"]
