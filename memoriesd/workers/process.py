"""Process set-up shared by the daemon and its child processes: hardening, heap bounds, and how a child is started."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..home import Home

#: Started as ``python -I -c BOOT ROOT MODULE ARGS...``: ``-I`` keeps the caller's working directory,
#: PYTHONPATH and user site off ``sys.path`` (``python -m`` would import a ``memoriesd/`` folder lying in
#: the directory where someone typed ``memories``, into the process that receives passphrases), and
#: ROOT is the folder the starting process imported this package from, so the child runs the same code.
BOOT = (
    "import sys, runpy; root, module = sys.argv[1], sys.argv[2]; sys.path.insert(0, root); "
    "sys.argv = [module] + sys.argv[3:]; runpy.run_module(module, run_name='__main__', alter_sys=True)"
)

#: Beyond a vault's drain bound, how long a locking worker (or a killed model process) may take to exit.
EXIT_GRACE_SECONDS = 15.0


def package_root() -> str:
    """The absolute folder holding the ``memoriesd`` package this process runs."""
    return str(Path(__file__).resolve().parents[2])


def child_command(module: str, *args: str) -> list[str]:
    """The argv that runs ``module`` as ``__main__`` in an isolated interpreter of this installation."""
    return [sys.executable, "-I", "-c", BOOT, package_root(), module, *args]


def harden() -> None:
    """No core dumps, not ptrace-able by same-uid processes where the kernel allows, private files."""
    import os

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


def bound_heap() -> None:
    """glibc: give every buffer of 128 KiB or more its own mapping, so freeing it returns the memory.

    By default glibc raises that threshold each time such a buffer is freed, after which the
    decrypted chunks of a sealed vector file (6 MiB each) come from the heap and stay in RSS once
    freed: +325 MiB kept after loading 100,000 vectors of 768 dimensions
    (bench/bench_memory.py; docs/benchmarks.md "Memory and the cache caps"). A no-op without glibc's mallopt.
    """
    try:
        import ctypes

        M_MMAP_THRESHOLD = -3
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


def setup_logging(home: Home, level: str) -> None:
    """The daemon's log (``logs/memoriesd.log``, 0600), shared by every process of the daemon."""
    from ..server.lograte import LogRateLimit

    fd = os.open(home.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8", buffering=1))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # No flood can fill the disk: the same line more than 10 times a minute is counted, not written.
    handler.addFilter(LogRateLimit(handler))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for noisy in ("jieba", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


__all__ = ["EXIT_GRACE_SECONDS", "setup_logging", "harden", "bound_heap", "child_command", "package_root"]
