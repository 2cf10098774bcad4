"""`memoriesd`: the long-running daemon on a Unix socket in the Memories home.

One daemon per home (an flock on ``run/memoriesd.lock``). The process that owns the socket is the
*router* (:mod:`memoriesd.workers.router`): it holds no vault key, passphrase or note; each unlocked
vault is served by its own process, which lock ends, and the local model by a model process. Every connection's peer uid is checked
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
    Busy,
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
from ..kinds.registry import register_builtin_kinds
from ..rag.engine import RagEngine  # noqa: E402
from ..vault.crypto import KeyWiped  # noqa: E402
from ..vault.manager import VaultManager  # noqa: E402
from ..watch import WatchService  # noqa: E402
from ..workers import router  # noqa: E402  (vault.route, model.route and the router role)
from ..workers.process import bound_heap, harden, setup_logging  # noqa: E402
from . import (  # noqa: E402
    conversation_handlers,
    extract_handlers,
    grants,
    handlers,
    memory_handlers,
    protocol,
    rag_handlers,
    tidy_handlers,
)
from .config_watch import ConfigWatch, name_config_path  # noqa: E402
from .context import Context, Params  # noqa: E402
from .handlers import HANDLERS  # noqa: E402
from .lograte import installed_limits  # noqa: E402

# Every method family, imported eagerly and unconditionally: each module registers its methods in
# HANDLERS, and a module that fails to import stops the daemon at start (never a silent "unknown
# method" for a whole family later).
METHOD_MODULES = (handlers, grants, rag_handlers, memory_handlers, tidy_handlers, conversation_handlers, extract_handlers, router)

log = logging.getLogger("memoriesd")

#: File descriptors kept free for everything but client connections (vault files, the model, the log).
FD_RESERVE = 64
#: Bytes of a connection's unread input kept in memory (twice this before reading pauses).
READ_LIMIT = 64 * 1024
#: Transport write buffer: drain() waits above HIGH until the buffer is below LOW.
WRITE_HIGH = 256 * 1024
WRITE_LOW = 64 * 1024


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit toward the hard one (at most 65,536); return the soft limit in force."""
    cap = 1 << 16
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return cap
    inf = resource.RLIM_INFINITY
    target = cap if hard == inf else min(hard, cap)
    if soft != inf and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return cap if soft == inf else int(soft)


def connection_limit(configured: int, nofile: int) -> int:
    """``[daemon] max_connections``, capped so client sockets can never exhaust the open-file limit."""
    return max(1, min(configured, nofile - FD_RESERVE))


class App:
    """Everything a handler may use: home, config, vaults and the retrieval engine."""

    workers: Any = None  # the process role (memoriesd.workers): the Router or a vault's worker; None = in-process use

    def __init__(self, home: Home, config: Config, config_watch: ConfigWatch | None = None, vaults: Any = None) -> None:
        self.home = home
        self.config = config
        # config.toml as read at start: an edit since is said in every reply ("restart pending").
        self.config_watch = config_watch or ConfigWatch(home.config_path)
        self.vaults = vaults or VaultManager(home, config)
        self.started = time.monotonic()
        self._stop_cb: Any = None
        self.rag: Any = RagEngine(self)
        self.watch = WatchService(self)  # [[watch.folder]] folders, watched while their vault is unlocked

    def notices(self) -> list[str]:
        """Notices every reply carries (the frame's ``notices``): today, an edited config.toml."""
        return self.config_watch.notices()

    def request_stop(self) -> None:
        if self._stop_cb is not None:
            self._stop_cb()

    def dispatch(self, method: str, ctx: Context) -> dict[str, Any]:
        handler = HANDLERS.get(method) if self.workers is None else self.workers.handler(method)
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
    """One client. Bounded: at most ``max_requests_per_connection`` requests in flight (no further frame
    is read until one ends: backpressure on the client), replies it does not read for
    ``write_timeout_seconds`` cut it off, and the server closes it after ``idle_timeout_seconds``
    without a request."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.write_lock = asyncio.Lock()
        self.cancelled = threading.Event()
        self.grant: Any = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(server.max_inflight)
        self.last_active = time.monotonic()
        self.closed = False
        with contextlib.suppress(Exception):
            writer.transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)

    @property
    def idle(self) -> bool:
        return not self.tasks and not self.closed

    def close(self) -> None:
        """Close gracefully (buffered replies are still written): the idle timeout."""
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()

    def cut_off(self) -> None:
        """Drop the connection and its unsent replies; its running requests are cancelled."""
        self.closed = True
        self.cancelled.set()
        with contextlib.suppress(Exception):
            self.writer.transport.abort()

    async def send(self, message: dict[str, Any]) -> None:
        try:
            data = protocol.encode(message, self.server.max_frame * 2)
        except FrameTooLarge as exc:
            data = protocol.encode({"id": message.get("id"), "error": exc.to_dict()})
        async with self.write_lock:
            if self.closed or self.writer.is_closing():
                return
            self.writer.write(data)
            try:
                await asyncio.wait_for(self.writer.drain(), self.server.write_timeout)
            except TimeoutError:
                log.warning("cut off a client that read none of its replies for %g s", self.server.write_timeout)
                self.cut_off()
            except ConnectionError:
                pass

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.slots.release()
        self.last_active = time.monotonic()

    async def _next_frame(self) -> bytes | None:
        """The next request frame, or None when the connection ended (or must end)."""
        try:
            header = await self.reader.readexactly(protocol.HEADER.size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.last_active = time.monotonic()
        (n,) = protocol.HEADER.unpack(header)
        if n > self.server.max_frame:
            err = FrameTooLarge(
                f"the request frame is {n:,} bytes, over the {self.server.max_frame // (1024 * 1024)} MiB limit"
            )
            await self.send({"id": None, "error": err.to_dict()})
            return None  # the stream cannot be resynchronised without reading it
        try:
            payload = await self.reader.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.last_active = time.monotonic()
        return payload

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                await self.slots.acquire()  # backpressure: read nothing more while the bound is reached
                slot_held = True
                try:
                    if self.closed:
                        return
                    payload = await self._next_frame()
                    if payload is None or self.closed:
                        return
                    try:
                        req = protocol.decode(payload)
                    except ProtocolError as exc:
                        await self.send({"id": None, "error": exc.to_dict()})
                        continue
                    task = loop.create_task(self.handle(req))
                    self.tasks.add(task)
                    slot_held = False  # released when the task ends
                    task.add_done_callback(self._finished)
                finally:
                    if slot_held:
                        self.slots.release()
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
            if self.server.stopping.is_set():  # accepted before the listener closed: nothing may run now
                ending = getattr(self.server.app.workers, "ending_error", None)
                raise ending() if callable(ending) else Busy("memoriesd is stopping: run the command again in a moment")
            if method == "session.grant":
                fut = loop.run_in_executor(self.server.pool, grants.present_grant, self.server.app, self, Params(req.get("params")))
                result = await self._keepalive_until(rid, fut)
                await self.send(self._reply(rid, "result", result))
                return

            def progress(p: dict[str, Any]) -> None:
                asyncio.run_coroutine_threadsafe(self.send({"id": rid, "progress": p}), loop)

            ctx = Context(Params(req.get("params")), progress, self.cancelled, self.grant)
            result = await self._keepalive_until(rid, loop.run_in_executor(self.server.pool, self.server.app.dispatch, method, ctx))
            await self.send(self._reply(rid, "result", result))
        except MemoriesError as exc:
            if exc.code in ("internal",):
                log.error("request failed: %s", exc.code)
            err_dict = exc.to_dict()
            err_dict["message"] = name_config_path(err_dict["message"], self.server.app.home.config_path, exc.code)
            await self.send(self._reply(rid, "error", err_dict))
        except Exception:
            log.exception("internal error in %s", req.get("method") if isinstance(req.get("method"), str) else "?")
            err = Internal("the daemon hit an internal error; details are in the daemon log (logs/memoriesd.log)")
            await self.send(self._reply(rid, "error", err.to_dict()))

    def _reply(self, rid: Any, kind: str, body: Any) -> dict[str, Any]:
        """A result or error frame, with the daemon's ``notices`` (e.g. a pending restart) when there are any."""
        frame: dict[str, Any] = {"id": rid, kind: body}
        try:
            notices = self.server.app.notices()
        except Exception:  # noqa: BLE001 - a notice never costs a reply
            log.exception("could not compute the reply notices")
            notices = []
        if notices:
            frame["notices"] = notices
        return frame

    async def _keepalive_until(self, rid: Any, fut: asyncio.Future[Any]) -> Any:
        """Await ``fut``, sending ``{"id": rid, "progress": {"keepalive": true}}`` every ``keepalive_seconds``
        meanwhile, so a client can tell a long request from a hung daemon."""
        while True:
            done, _ = await asyncio.wait({fut}, timeout=self.server.keepalive)
            if done:
                return fut.result()
            await self.send({"id": rid, "progress": {"keepalive": True}})


class Server:
    def __init__(self, app: App, nofile: int | None = None) -> None:
        self.app = app
        self.socket_path = app.home.socket_path  # a vault worker listens on its own (memoriesd.workers)
        cfg = app.config.daemon
        self.max_frame = cfg.max_frame_mib * 1024 * 1024
        self.nofile = nofile if nofile is not None else raise_nofile_limit()
        self.max_connections = connection_limit(cfg.max_connections, self.nofile)
        self.max_inflight = cfg.max_requests_per_connection
        self.idle_timeout = cfg.idle_timeout_seconds
        self.write_timeout = cfg.write_timeout_seconds
        self.keepalive = cfg.keepalive_seconds
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="memoriesd")
        # The daemon's own uid only: no setting or environment variable adds another (SECURITY.md).
        self.allowed_uids = {os.getuid()}
        self.stopping = asyncio.Event()
        self.connections: set[Connection] = set()
        self.active = 0  # accepted client sockets not yet closed (each holds a file descriptor)

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

    def refuse_busy(self, sock: socket.socket) -> None:
        """Over the limit: one ``busy`` frame, written at once if the socket buffer takes it, and the
        socket closed right away (no transport, no task, no file descriptor kept)."""
        log.warning("refused a connection: %d connections are already served (the limit)", self.active)
        busy = Busy(
            f"the daemon already serves {self.active} connections: close idle clients (MCP servers, scripts) and retry"
        )
        with contextlib.suppress(OSError):
            sock.send(protocol.encode({"id": None, "error": busy.to_dict()}))
        sock.close()

    async def accept_loop(self, listener: socket.socket) -> None:
        """Accept one connection at a time, counting it before anything else uses a file descriptor for
        it, so client sockets can never exhaust the open-file limit."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _addr = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS...: back off (the log is rate-limited)
                log.error("cannot accept a connection (%s): retrying in a moment", exc.strerror or exc)
                await asyncio.sleep(0.5)
                continue
            if self.active >= self.max_connections:
                self.refuse_busy(sock)
            else:
                self.active += 1
                loop.create_task(self.serve_socket(sock))
            await asyncio.sleep(0)  # a flood of connections never starves the other clients

    async def serve_socket(self, sock: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_LIMIT)
            await self.on_client(reader, writer)
        except Exception:  # noqa: BLE001 - one client's failure is never the daemon's
            log.exception("a connection failed")
        finally:
            if writer is None:
                sock.close()
            else:
                writer.close()
                try:  # until its file descriptor is closed; a client that never reads cannot hold it
                    await asyncio.wait_for(writer.wait_closed(), self.write_timeout)
                except Exception:  # noqa: BLE001 - TimeoutError included
                    writer.transport.abort()
            self.active -= 1

    async def auto_lock_loop(self) -> None:
        minutes = self.app.config.daemon.auto_lock_minutes
        if minutes <= 0:
            return
        interval = max(0.05, min(1.0, minutes * 60 / 4))
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            await asyncio.sleep(interval)
            await loop.run_in_executor(self.pool, self.app.vaults.expire_idle)

    async def idle_close_loop(self) -> None:
        """Close connections with no request in flight and nothing read for ``idle_timeout_seconds``."""
        timeout = self.idle_timeout
        if timeout <= 0:
            return
        interval = max(0.05, min(5.0, timeout / 4))
        while not self.stopping.is_set():
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.idle and now - conn.last_active >= timeout:
                    log.info("closed a connection idle for %g s", timeout)
                    conn.close()

    async def log_summary_loop(self) -> None:
        """Write the log rate limit's summaries soon after their minute ends, even if nothing else is logged."""
        while not self.stopping.is_set():
            await asyncio.sleep(5.0)
            for limit in installed_limits():
                limit.flush()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        accepting = loop.create_task(self.accept_loop(listener))
        self.app._stop_cb = lambda: loop.call_soon_threadsafe(self.stopping.set)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("memoriesd %s serving (pid %d)", __version__, os.getpid())
        configured = self.app.config.daemon.max_connections
        if self.max_connections < configured:
            log.warning(
                "serving at most %d connections, not max_connections = %d: the open-file limit is %d "
                "(raise it with `ulimit -n` before starting memoriesd)",
                self.max_connections,
                configured,
                self.nofile,
            )
        if self.socket_path == self.app.home.socket_path:  # the daemon's own socket, not a vault's process
            print(f"memoriesd {__version__} listening on {self.socket_path}", file=sys.stderr, flush=True)
        auto = loop.create_task(self.auto_lock_loop())
        background = [loop.create_task(self.idle_close_loop()), loop.create_task(self.log_summary_loop())]
        background += [loop.create_task(c) for c in (self.app.workers.loops(self) if self.app.workers else ())]
        try:
            await self.stopping.wait()
        finally:
            log.info("stopping")
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await accepting
            listener.close()
            auto.cancel()
            for task in background:
                task.cancel()
            for conn in list(self.connections):
                conn.cancelled.set()
            # In-flight writes finish (each batch is atomic); give them a moment.
            self.pool.shutdown(wait=True, cancel_futures=True)
            await asyncio.to_thread(self.app.watch.close)
            if self.app.workers is not None:  # the router stops every vault worker (each locks its vault)
                await asyncio.to_thread(self.app.workers.close)
            await asyncio.to_thread(self.app.vaults.lock_all, "shutdown")
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            for limit in installed_limits():
                limit.flush_all()


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
    register_builtin_kinds()  # the record kinds the index knows (memoriesd.kinds.registry)
    home.check_socket_path()
    config_watch = ConfigWatch(home.config_path)  # before reading it: an edit from now on is noticed
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
        nofile = raise_nofile_limit()
        for note in config.deprecated:
            log.warning("config.toml: %s", note)
        app = App(home, config, config_watch)
        app.workers = router.Router(app, keep_fds=(lock_fd,))  # every vault in a process of its own
        try:
            asyncio.run(Server(app, nofile).run())
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
    bound_heap()
    try:
        home = resolve_home(args.home)
        code = run_daemon(home)
    except MemoriesError as exc:
        print(f"memoriesd: error[{exc.code}]: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()


__all__ = ["main", "App", "Server", "Path"]
