"""The composition root: ``memoriesd`` (the daemon) and the processes it starts for each vault.

Here, and only here, the parts are put together: the method table from every family's
declarations (:func:`method_table`), the typed :class:`~memoriesd.server.app.App`, and the process
role: the :class:`~memoriesd.workers.router.Router` for the daemon that owns the home's socket, a
:class:`~memoriesd.workers.worker.WorkerRole` for a vault's process. Importing a module registers
nothing; a family that fails to import stops the daemon at start (never a silent "unknown method"
for a whole family later).

- ``memoriesd [--home H]``: the daemon (one per home: an flock on ``run/memoriesd.lock``);
- ``python -I -c BOOT ROOT memoriesd.main vault-process --home H --socket PATH (--vault ID [--create] | --spare)``:
  a vault's process, started by the router (:func:`memoriesd.workers.process.child_command`).
"""

from __future__ import annotations

import os

# Before anything can import onnxruntime (see SECURITY.md: no telemetry files).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from . import __version__  # noqa: E402
from .config import Config, load_config  # noqa: E402
from .errors import DaemonRunning, MemoriesError  # noqa: E402
from .home import Home, resolve_home  # noqa: E402
from .kinds.registry import register_builtin_kinds  # noqa: E402
from .server.app import App  # noqa: E402
from .server.config_watch import ConfigWatch, keep_started, load_started_config, started_of  # noqa: E402
from .server.daemon import Server, raise_nofile_limit  # noqa: E402
from .server.method import MethodTable  # noqa: E402
from .server.methods import SERVER_METHODS  # noqa: E402
from .vault.manager import VaultManager  # noqa: E402
from .workers import router  # noqa: E402
from .workers.model_client import ModelClient  # noqa: E402
from .workers.process import bound_heap, harden, setup_logging  # noqa: E402
from .workers.worker import BoundVaults, WorkerRole  # noqa: E402

log = logging.getLogger("memoriesd")

#: The first argument that makes this module a vault's process instead of the daemon.
VAULT_PROCESS = "vault-process"


def method_table() -> MethodTable[App]:
    """Every method the daemon's processes serve: the families' and the router's own."""
    return MethodTable([*SERVER_METHODS, *router.METHODS])


def build_app(home: Home, config: Config, config_watch: ConfigWatch | None = None, vaults: VaultManager | None = None) -> App:
    """An application with the full method table and no role (in-process use: tests and scripts).

    The record kinds the index knows (cards, facts, conversations) are registered here, explicitly."""
    register_builtin_kinds()
    return App(home, config, method_table(), config_watch, vaults)


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
    config_watch = ConfigWatch(home.config_path)  # before reading it: an edit from now on is noticed
    config = load_config(home.config_path)
    lock_fd = acquire_lock(home)
    try:
        setup_logging(home, config.daemon.log_level)
        # We hold the lock, so any socket or pid file left behind is stale (a crash).
        for stale in (home.socket_path, home.pid_path):
            if stale.exists():
                log.warning("removed a stale %s from an earlier crash", stale.name)
                stale.unlink()
        home.pid_path.write_text(f"{os.getpid()}\n")
        keep_started(home, config_watch)  # its vault processes use these settings while an edit is invalid
        nofile = raise_nofile_limit()
        for note in config.deprecated:
            log.warning("config.toml: %s", note)
        app = build_app(home, config, config_watch)
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


def vault_process_main(argv: list[str]) -> None:
    """One vault's process (see :mod:`memoriesd.workers.worker`); exits with ``os._exit``."""
    parser = argparse.ArgumentParser(prog="memoriesd-vault", description="One vault's process (started by memoriesd).")
    parser.add_argument("--home", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--vault", default="")
    parser.add_argument("--create", action="store_true", help="serve vault.create for this new vault id")
    parser.add_argument("--spare", action="store_true", help="wait for `bind VAULT_ID [create]` on stdin")
    args = parser.parse_args(argv)
    if bool(args.vault) == args.spare:
        parser.error("give --vault ID or --spare")
    harden()
    bound_heap()
    code = 0
    try:
        home = resolve_home(args.home)
        started = started_of(home)  # the daemon's settings: an invalid edit must not fail this unlock
        config_watch = ConfigWatch(home.config_path, started)
        config = load_started_config(home, started)
        setup_logging(home, config.daemon.log_level)
        for h in logging.getLogger().handlers:
            h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s [vault {args.vault or '(spare)'}]: %(message)s"))
        role = WorkerRole(args.vault)
        vaults = BoundVaults(home, config, args.vault, args.create, role.unlocked)
        app = build_app(home, config, config_watch, vaults)
        app.workers = role
        role.app = app
        # The local model lives in the model process, which the router ends when this vault locks.
        app.rag.embedding.local_factory = lambda *_a, **_k: ModelClient(home, role.vault_id)
        server = Server(app)
        server.socket_path = Path(args.socket)
        asyncio.run(server.run())
        logging.getLogger("memoriesd.workers").info("vault %s: its process ends", role.vault_id or "(spare)")
    except Exception:  # noqa: BLE001 - said in the log; the router reports the vault locked
        logging.getLogger("memoriesd.workers").exception("vault process failed")
        code = 1
    logging.shutdown()
    # Background threads (indexer, watchers, model release) must not keep a locked vault's process alive.
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """The ``memoriesd`` console script."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == [VAULT_PROCESS]:
        vault_process_main(args_in[1:])
        return
    parser = argparse.ArgumentParser(
        prog="memoriesd",
        description="The Memories daemon: keeps vaults decrypted only in its own memory and serves the "
        "`memories` CLI over a Unix socket in the Memories home. Runs in the foreground.",
    )
    parser.add_argument("--home", help="Memories home (default: $MEMORIES_HOME, else ~/.memories)")
    parser.add_argument("--version", action="version", version=f"memoriesd {__version__}")
    args = parser.parse_args(args_in)
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


__all__ = ["main", "run_daemon", "build_app", "method_table", "acquire_lock", "vault_process_main", "VAULT_PROCESS"]
