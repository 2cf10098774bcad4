"""Process set-up shared by the daemon and its vault workers (moved here from ``server/daemon.py``)."""

from __future__ import annotations


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
    (scripts/bench_memory.py; README "Memory and the cache caps"). A no-op without glibc's mallopt.
    """
    try:
        import ctypes

        M_MMAP_THRESHOLD = -3
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


__all__ = ["harden", "bound_heap"]
