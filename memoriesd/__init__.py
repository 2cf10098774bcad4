"""Memories: a local-first, encrypted personal knowledge vault (daemon and core library)."""

__version__ = "0.1.0"
